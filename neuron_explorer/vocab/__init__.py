"""The project's vocabulary, declared once: event kinds, engines, whose code a frame is, interval
algorithms and the DeviceSpec dataclass. Pure Python at import (no torch, numpy or pyarrow): it
sits below the backend and the profile model, and every layer above reads it (docs/architecture.md).
"""
