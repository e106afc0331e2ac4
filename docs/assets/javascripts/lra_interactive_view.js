// The interactive LRA chart (docs/results/interactive.md): draws window.LRA_CHART, the chart command's
// lra_interactive.json, with the vendored Plotly (plotly.min.js beside this file; no network).
// One panel and one arm at a time, chosen in the two menus; every point hovers with its figures and files.
(function () {
  "use strict";
  const chart = window.LRA_CHART;
  const plot = document.getElementById("lra-interactive");
  const panelMenu = document.getElementById("lra-panel");
  const armMenu = document.getElementById("lra-arm");
  const count = document.getElementById("lra-count");
  if (!chart || !plot || !panelMenu || !armMenu || typeof Plotly === "undefined") {
    return;
  }
  chart.panels.forEach((panel, i) => panelMenu.add(new Option(panel.title, String(i))));
  chart.arms.forEach((arm) => armMenu.add(new Option(arm, arm)));

  // The points of one panel and arm: the paper's points go with the from-scratch arm.
  function shown(panel, arm) {
    return panel.points.filter((p) => p.arm === arm || (p.arm === "LRA paper" && arm === chart.arms[0]));
  }

  function trace(name, points) {
    return {
      type: "scatter", mode: "markers", name: name,
      x: points.map((p) => p.x), y: points.map((p) => p.y),
      error_y: {type: "data", array: points.map((p) => p.err || 0), visible: true, thickness: 1, width: 3},
      marker: {size: points.map((p) => p.size), color: points.map((p) => p.color),
               symbol: points.map((p) => p.symbol), opacity: 0.7, line: {width: 1, color: "#333"}},
      text: points.map((p) => p.hover.join("<br>")),
      hovertemplate: "%{text}<extra></extra>",
    };
  }

  function draw() {
    const panel = chart.panels[Number(panelMenu.value)];
    const points = shown(panel, armMenu.value);
    const groups = [["ours", points.filter((p) => p.arm !== "LRA paper")],
                    ["LRA paper", points.filter((p) => p.arm === "LRA paper")]];
    const traces = groups.filter(([, pts]) => pts.length).map(([name, pts]) => trace(name, pts));
    Plotly.react(plot, traces, {
      xaxis: {type: panel.log_x ? "log" : "linear", title: {text: panel.xlabel}},
      yaxis: {title: {text: panel.ylabel}},
      hovermode: "closest", showlegend: true, legend: {orientation: "h", y: -0.25},
      margin: {l: 70, r: 20, t: 20, b: 90}, height: 560,
    }, {displaylogo: false, responsive: true});
    plot.dataset.points = String(points.length);
    count.textContent = `${points.length} points: ${panel.title}, ${armMenu.value}` +
      (points.length ? "" : " (none: no variant has both)");
  }

  panelMenu.addEventListener("change", draw);
  armMenu.addEventListener("change", draw);
  draw();
})();
