"""The `neuron` device: a modeled AWS Trainium NeuronCore registered with PyTorch."""
