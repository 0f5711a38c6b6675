"""The links between GPUs as deployed: NVLink inside a node, the node's network adapters shared
by its GPUs across nodes, each at the fraction of its datasheet rate that NCCL is measured to
reach, and the time of a collective over a group of ranks laid out on them. Every time here is
*modeled*.

    collective_s("A100", "all-reduce", 2e9, n=32, stride=1)   # seconds, 32 ranks on 4 nodes

A node (FABRICS): its GPUs, NVLink's rate per GPU per direction, its network adapters for
compute traffic and the rate of one, each with the fraction achieved and where it was measured.
NCCL's bus bandwidth (nccl-tests' busbw: the rate a ring's slowest link carries) is the measure:
  NVLink 3 (A100)  ~230 GB/s of 300 (NVIDIA's NCCL lead, nccl-tests issue #149);
  NVLink 4 (H100, H200)  ~370 GB/s of 450 without NVLink SHARP (nccl-tests issue #212);
  HDR InfiniBand 200 Gb/s (25 GB/s)  ~24 GB/s a NIC (NCCL issue #412), 192 GB/s all-reduce
      busbw on a DGX A100's eight (NCCL issue #812);
  NDR InfiniBand 400 Gb/s (50 GB/s)  48-49 GB/s a NIC (nccl-tests issue #267);
  PCIe 4.0 x16 (31.5 GB/s)  ~25 GB/s copies to an RTX 4090 (nvbandwidth issue #15).
docs/references.md carries each figure with its address.

A collective over n ranks `stride` apart in rank order (Megatron's: tensor fastest, then data,
then pipeline, so a data-parallel group's members sit t apart) is hierarchical, as NCCL's rings
over several NICs and the hand-written two-level schemes run it: k = the members on one node
(min(n, node / stride), 1 when stride >= node) reduce-scatter over NVLink, the n / k nodes then
reduce-scatter (and all-gather) the 1/k each GPU holds over the network, and the k all-gather
back over NVLink. A ring moves (r - 1)/r of the buffer per GPU for a reduce-scatter or an
all-gather among r, twice that for an all-reduce. Every GPU of a node runs its own group's
collective at once (the t data-parallel groups of a node), so the network gives each GPU its
node's adapters / GPUs a node. A group inside one node never touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster import offload

NVLINK3 = "nccl-tests issue #149 (NVIDIA, S. Jeaugey): A100 NVLink3 ~230 GB/s bus bandwidth"
NVLINK4 = ("nccl-tests issue #212 (NVIDIA, S. Jeaugey): H100 NVLink4 ~370 GB/s effective "
           "(ring, protocol overhead ~20%) of 450")
HDR = ("NCCL issue #412 (NVIDIA, S. Jeaugey): 200G HDR peak ~24 GB/s inter-node; NCCL issue "
       "#812 (NVIDIA, D. Addison): DGX A100, 8x200 Gb/s IB, 192 GB/s all-reduce busbw")
NDR = "nccl-tests issue #267 (NVIDIA, D. Addison): CX-7 NDR 400 Gb/s 48-49 GB/s per NIC"
PCIE = ("NVIDIA/nvbandwidth issue #15: eight RTX 4090s, host_to_device_memcpy_ce 23.9-26.4 "
        "GB/s each over PCIe 4.0 x16 (31.5 GB/s): ~25; taken for peer traffic too")


@dataclass(frozen=True)
class Fabric:
    """One node's links: GPUs, NVLink per GPU per direction and the fraction NCCL reaches,
    network adapters (compute), one adapter's rate per direction and its fraction."""

    node: int
    nvlink: float
    nvlink_achieved: float
    nics: int
    nic: float
    nic_achieved: float
    name: str
    sources: tuple

    @property
    def intra(self) -> float:
        """Bytes/s a GPU reaches to another GPU of its node."""
        return self.nvlink * self.nvlink_achieved

    @property
    def inter(self) -> float:
        """Bytes/s a GPU reaches across nodes while every GPU of its node sends: the node's
        adapters shared by its GPUs."""
        return self.nics * self.nic * self.nic_achieved / self.node


_PCIE4 = offload.LINKS["PCIe 4.0 x16"]
FABRICS = {
    # DGX A100 datasheet: 8 A100s on NVSwitch (NVLink 600 GB/s both ways), 8 single-port
    # ConnectX-6 200 Gb/s HDR InfiniBand for compute (the 80GB and the 40GB systems alike)
    "A100-SXM4-80GB": Fabric(8, 300e9, 230 / 300, 8, 25e9, 24 / 25, "DGX A100",
                             (NVLINK3, HDR)),
    "A100-SXM4-40GB": Fabric(8, 300e9, 230 / 300, 8, 25e9, 24 / 25, "DGX A100",
                             (NVLINK3, HDR)),
    # DGX H100 / H200 datasheets: NVLink 900 GB/s both ways, 8x ConnectX-7 400 Gb/s NDR
    "H100-SXM5-80GB": Fabric(8, 450e9, 370 / 450, 8, 50e9, 48 / 50, "DGX H100",
                             (NVLINK4, NDR)),
    "H200-SXM-141GB": Fabric(8, 450e9, 370 / 450, 8, 50e9, 48 / 50, "DGX H200",
                             (NVLINK4, NDR)),
    # PCIe cards: peers over PCIe 4.0 x16 inside a server of 8 (L4) or alone (RTX 4090),
    # one PCIe-rate adapter a GPU across servers
    "L4": Fabric(8, _PCIE4, 25e9 / _PCIE4, 8, _PCIE4, 25e9 / _PCIE4, "PCIe server", (PCIE,)),
    "RTX-4090": Fabric(1, _PCIE4, 25e9 / _PCIE4, 1, _PCIE4, 25e9 / _PCIE4, "workstation",
                       (PCIE,)),
}
KINDS = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}


def fabric(name: str) -> Fabric:
    """The Fabric of a GPU by its spec-table name (ckptlab.measure.gpus)."""
    if name not in FABRICS:
        raise ValueError(f"gpu: no interconnect figures for {name}; expected one of "
                         f"{sorted(FABRICS)}")
    return FABRICS[name]


def per_node(f: Fabric, n: int, stride: int) -> int:
    """Members of a group of n ranks `stride` apart that share one node."""
    if stride >= f.node:
        return 1
    return max(1, min(n, f.node // stride))


def collective_s(f: Fabric, kind: str, nbytes: float, n: int, stride: int = 1) -> float:
    """Seconds of one collective of `kind` (KINDS) on a buffer of nbytes per GPU (the whole
    buffer: an all-reduce's input, a reduce-scatter's input, an all-gather's output) among n
    ranks `stride` apart: hierarchical as the module says."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {sorted(KINDS)}, got {kind!r}")
    if n <= 1 or nbytes <= 0:
        return 0.0
    k = per_node(f, n, stride)
    outer = -(-n // k)
    factor = KINDS[kind]
    inside = factor * (k - 1) / k * nbytes / f.intra
    across = factor * (outer - 1) / outer * nbytes / k / f.inter
    return inside + across
