"""Neuron Explorer: profile model, capture, importers, exporters, analysis and CLI."""

__version__ = "0.1.0"
