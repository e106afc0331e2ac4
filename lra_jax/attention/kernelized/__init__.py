"""Kernelized attention: softmax replaced by a feature map, so attention is a product of two thin matrices (Performer, Linear, Taylor)."""
