"""What captures each layer: tensor/token recorders, the trace recorder and its sandbox."""
