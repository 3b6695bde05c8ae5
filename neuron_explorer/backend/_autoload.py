"""Entry point for PyTorch's device-backend autoload (`torch.backends` group in pyproject).

`import torch` turns any exception raised here into a failure of `import torch` itself, so this
hook only imports the backend and warns, never raises.
"""

from __future__ import annotations


def autoload() -> None:
    """Register the `neuron` device; on any failure warn and leave it unregistered."""
    try:
        from neuron_explorer.backend import _registration

        _registration.register()
    except Exception as exc:  # noqa: BLE001 - torch would turn it into an import failure
        import warnings

        warnings.warn(f"neuron device not registered: {exc!r}", RuntimeWarning, stacklevel=2)
