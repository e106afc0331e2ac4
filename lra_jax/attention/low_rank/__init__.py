"""Low-rank approximations of the attention matrix (Linformer's projections, Nystromformer's landmarks)."""
