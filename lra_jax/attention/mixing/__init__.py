"""Token mixing without attention: convolutions (lightweight, dynamic) and MLP/Fourier mixers (MLP-Mixer, FNet, gMLP)."""
