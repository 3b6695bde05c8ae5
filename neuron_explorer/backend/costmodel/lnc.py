"""Logical NeuronCores (LNC): two physical cores of a trn2 or trn3 chip run as one core.

The Neuron SDK groups the physical NeuronCores of trn2 and trn3 in pairs by default
(`NEURON_LOGICAL_NC_CONFIG=2`; neuronx-cc's `--lnc`, which must match it): a logical core
"combin[es] the compute and memory resources" of its physical cores [lnc-config], and a NEFF
compiled for LNC=2 holds instructions for each of the two, which work on different parts of
the data and share one HBM bank [nki-lnc]. trn1 supports only 1 [earg001].

The logical core's spec (`logical_spec`) keeps one physical core's engines and doubles what the
pair holds side by side: DMA queues and bandwidth, the HBM bank's bandwidth (the bank's two
cores' shares), SBUF and PSUM. Lowering (costmodel/lowering.py) splits each kernel's engine
work over the pair where it splits; fixed costs (an instruction's overhead, a DMA transfer's
latency, the launch) are paid by each core in parallel, so they are not halved.
"""

from __future__ import annotations

import dataclasses
import os

from neuron_explorer.vocab.device_spec import DeviceSpec

LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"
_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
SRC_LNC = f"{_DOCS}/general/arch/neuron-features/logical-neuroncore-config.html"
SRC_NKI_LNC = f"{_DOCS}/nki/get-started/about/lnc.html"
SRC_EARG001 = f"{_DOCS}/compiler/error-codes/EARG001.html"
SRC_EVRF066 = f"{_DOCS}/compiler/error-codes/EVRF066.html"

# the LNC degrees each chip supports: 1 or 2 on trn2 and trn3 [lnc-config], 1 on trn1 [earg001]
DEGREES = {"trn1": (1,), "trn2": (1, 2), "trn3": (1, 2)}
SUFFIX = "-lnc"  # a logical spec's name: "trn2-lnc2"

_PAIR = (
    SRC_LNC + ": a logical NeuronCore combines the compute and memory resources of its "
    "physical cores; " + SRC_NKI_LNC + ": each core runs its own part of the NEFF, on its own "
    "engines, DMA queues and SBUF. The pair's: twice one physical core's ("
)
_DOUBLED = ("dma_bytes_per_s", "dma_queues", "sbuf_bytes", "psum_bytes")


def degree_from_env() -> int | None:
    """$NEURON_LOGICAL_NC_CONFIG as 1 or 2, None when unset; any other value is refused."""
    raw = os.environ.get(LNC_ENV_VAR, "").strip()
    if not raw:
        return None
    if raw not in ("1", "2"):
        raise ValueError(f"{LNC_ENV_VAR}={raw}: the Neuron SDK supports only 1 or 2")
    return int(raw)


def logical_spec(spec: DeviceSpec, degree: int) -> DeviceSpec:
    """`spec` (one physical core) as the logical core of `degree` physical cores; 1 is `spec`
    itself. A chip that does not support the degree (trn1 at 2) raises a one-line ValueError."""
    if degree not in DEGREES.get(spec.name, (1,)):
        raise ValueError(
            f"{LNC_ENV_VAR}={degree}: {spec.name} ({spec.core}) has no logical NeuronCores of "
            f"{degree} physical cores (supported: {', '.join(map(str, DEGREES.get(spec.name, (1,))))})"
        )
    if degree == 1:
        return spec
    was = dict(spec.sources)
    sources = {**was, **{f: _PAIR + was.get(f, "") + ")" for f in _DOUBLED}}
    sources["cores_per_chip"] = (
        SRC_LNC + f": LNC={degree} exposes {spec.cores_per_chip // degree} logical cores per "
        f"chip (of {spec.cores_per_chip} physical); " + was.get("cores_per_chip", "")
    )
    sources["logical_cores"] = (
        SRC_LNC + f": LNC={degree}, the default on trn2 and later (" + SRC_EVRF066 + ")"
    )
    return dataclasses.replace(
        spec,
        name=f"{spec.name}{SUFFIX}{degree}",
        core=f"{degree} x {spec.core} (LNC={degree})",
        cores_per_chip=spec.cores_per_chip // degree,
        dma_bytes_per_s=spec.dma_bytes_per_s * degree,
        dma_queues=spec.dma_queues * degree,
        sbuf_bytes=spec.sbuf_bytes * degree,
        psum_bytes=spec.psum_bytes * degree,
        logical_cores=degree,
        sources=tuple(sources.items()),
    )


def physical_name(name: str) -> tuple[str, int]:
    """("trn2", 2) for "trn2-lnc2"; (name, 1) for a name without the suffix."""
    chip, sep, degree = name.partition(SUFFIX)
    if sep and degree.isdigit():
        return chip, int(degree)
    return name, 1


def physical_source(spec_name: str) -> str:
    """The source line of `logical_cores` for a physical core's spec (LNC=1)."""
    if spec_name == "trn1":
        return SRC_EARG001 + ": trn1 supports only LNC=1 (one physical NeuronCore-v2)"
    return (
        SRC_LNC + ": LNC=1, one physical core (the SDK's default is 2: set "
        f"{LNC_ENV_VAR}=2 to model the pair)"
    )
