"""Model states in host memory: ZeRO-Offload's optimizer offload and ZeRO-Infinity's parameter
offload, as one more way the planner fits a step into a GPU. Every number here is *modeled*.

    layout = Layout(offload="optimizer")             # or "params"; "none" is the GPU alone
    zero_offload.gpu_states(model, layout, recipe)   # what stays on the GPU, by term
    zero_offload.host_bytes(model, layout, recipe)   # what the host holds

"optimizer"  ZeRO-Offload (Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model
             Training", USENIX ATC, section 4.1, Fig. 5): the fp32 master weights, Adam's
             momentum and variance and the fp32 gradients live in host memory and the Adam step
             runs on the CPU (DeepSpeed's CPUAdam). The GPU keeps the 16-bit parameters and a
             gradient bucket: each bucket's gradients go down over PCIe during the backward
             (DeepSpeed's reduce_bucket_size, 5e8 elements by default, at least the largest
             parameter, which autograd produces whole: the vocabulary's V h / t); the updated
             16-bit parameters come up after the CPU step.
"params"     and the 16-bit parameters in host memory too (ZeRO-Infinity, Rajbhandari et al.
             2021, offload_param to the CPU): each layer's parameters stream up over PCIe
             before its forward and again before its backward (which also serves its
             recompute). The GPU holds the largest unit being computed (a layer, or the
             embedding / head) and DeepSpeed's prefetch bucket (stage3_prefetch_bucket_size,
             ckptlab.cluster.zero3), and the gradient bucket; no parameters come up after the
             step: the CPU writes the 16-bit copy where it lives.
Host memory (a GPU's share): master weights and Adam's states (12 bytes a parameter with Adam)
plus the fp32 gradients (4): 16 bytes a parameter, with "params" the 16-bit parameters (2) too,
and pinned staging for two gradient buckets (double-buffered copies).
Time, per step of m micro-batches (PCIe at the rate achieved host to device: host_link):
  gradients down  parameters x grad bytes each micro-batch, hidden behind that micro-batch's
                  backward: exposed max(0, down - backward);
  parameters      ("params") parameters x param bytes up before each forward and each
                  backward: exposed max(0, up - forward) + max(0, max(up, down) - backward)
                  (PCIe is full duplex: the gradients go down beside them);
  CPU Adam        memory-bound on the host: CPU_ADAM_BYTES a parameter at the host's DRAM
                  rate (HOSTS), shared by the node's GPUs that step at once;
  parameters up   ("optimizer") parameters x param bytes after the CPU step, exposed.
  Both after the backward unless delayed (ZeRO-Offload's one-step delayed parameter update,
  section 4.2: the CPU step and the upload of step i run during step i + 1's forward and
  backward; its first steps run undelayed): then only what exceeds the GPU's step is exposed.
Modeled for one data-parallel rank and one pipeline stage (the single-GPU recipe, or tensor
parallelism inside a node); sharded over data-parallel ranks (ZeRO-2 / -3 with offload) is not.
"""

from __future__ import annotations

from dataclasses import replace

from ckptlab.cluster import offload, zero3

MODES = ("none", "optimizer", "params")
CHOICES = MODES + ("auto",)
REDUCE_BUCKET = zero3.DEEPSPEED["reduce_bucket"]  # DeepSpeed's reduce_bucket_size default
GIB = 2**30
HOST_MEMORY = 64 * GIB  # a workstation's host memory, the default a plan checks against
# PCIe host <-> GPU as measured: eight RTX 4090s, host_to_device_memcpy_ce 23.9-26.4 GB/s each
# over PCIe 4.0 x16 (NVIDIA/nvbandwidth issue #15; ckptlab.cluster.links): ~25 GB/s of 31.5.
# Taken at the same fraction of PCIe 5.0 x16 for H100 and H200 SXM (their host link).
_FRACTION = 25e9 / offload.LINKS["PCIe 4.0 x16"]
# The CPU's Adam step streams, a parameter: the fp32 gradient, master weight, momentum and
# variance read (16 bytes), the last three written back (12) and the 16-bit copy written (2):
# 30 bytes, bound by the host's memory bandwidth (CPUAdam is vectorized with AVX2/AVX-512:
# DeepSpeed's csrc/adam), which the node's GPUs share. The hosts' DRAM at its datasheet rate
# (channels x MT/s x 8 bytes; JEDEC DDR4-3200, DDR5-4800), so the step is a lower bound:
_DDR4_3200, _DDR5_4800 = 3200e6 * 8, 4800e6 * 8
_WORKSTATION = ("a workstation: two channels of DDR5-4800", 2 * _DDR5_4800)
_DGX_A100 = ("DGX A100: two AMD EPYC 7742, 8 channels of DDR4-3200 each", 16 * _DDR4_3200)
_DGX_H100 = ("DGX H100 / H200: two Xeon Platinum 8480C, 8 channels of DDR5-4800 each",
             16 * _DDR5_4800)
HOSTS = {  # GPU -> (its host link's rate, what the host is, the host's DRAM bytes/s)
    "A100-SXM4-80GB": ("PCIe 4.0 x16",) + _DGX_A100,
    "A100-SXM4-40GB": ("PCIe 4.0 x16",) + _DGX_A100,
    "H100-SXM5-80GB": ("PCIe 5.0 x16",) + _DGX_H100,
    "H200-SXM-141GB": ("PCIe 5.0 x16",) + _DGX_H100,
    "L4": ("PCIe 4.0 x16", "a two-socket server like DGX H100's (assumed)", 16 * _DDR5_4800),
    "RTX-4090": ("PCIe 4.0 x16",) + _WORKSTATION,
}
CPU_ADAM_BYTES = 30


def check(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"offload: expected one of {MODES}, got {mode!r}")
    return mode


def problem(layout) -> str | None:
    """Why `layout` cannot offload (None when it can)."""
    if layout.pp > 1 or layout.dp > 1:
        return (f"offload is modeled for one data-parallel rank and one pipeline stage (here "
                f"d = {layout.dp}, p = {layout.pp})")
    return None


def grad_bucket(model, t: int) -> int:
    """Elements of the gradient bucket the GPU holds: reduce_bucket_size, at least the largest
    parameter (the vocabulary's V h / t), at most all of them."""
    return min(max(REDUCE_BUCKET, model.vocab * model.hidden // t), model.params(t))


def streamed(model, t: int) -> int:
    """Parameters on the GPU while they stream ("params"): the largest unit and the prefetch
    bucket behind it."""
    unit = max(model.layer_params(t), model.vocab * model.hidden // t)
    return unit + zero3.DEEPSPEED["prefetch_bucket"]


def gpu_states(model, layout, rec) -> dict:
    """{params, grad bucket} bytes on the GPU of an offloading layout (step_memory's states)."""
    t = layout.tp
    params = streamed(model, t) if check(layout.offload) == "params" else model.params(t)
    return {"params": params * rec.param, "grad bucket": grad_bucket(model, t) * rec.grad}


def host_bytes(model, layout, rec) -> dict:
    """{term: bytes} host memory one GPU's offload needs."""
    psi = model.params(layout.tp)
    out = {"master + optimizer": psi * (rec.master + rec.optimizer), "fp32 grads": psi * 4}
    if check(layout.offload) == "params":
        out["params"] = psi * rec.param
    out["pinned buckets"] = 2 * grad_bucket(model, layout.tp) * rec.grad
    return out


def host_link(gpu_name: str) -> float:
    """Bytes/s one GPU reaches to its host, a direction."""
    if gpu_name not in HOSTS:
        raise ValueError(f"gpu: no host figures for {gpu_name}; expected one of "
                         f"{sorted(HOSTS)}")
    return offload.LINKS[HOSTS[gpu_name][0]] * _FRACTION


def cpu_adam_s(psi: int, gpu_name: str, sharing: int) -> float:
    """Seconds of the CPU's Adam step on psi parameters while `sharing` GPUs of the node step
    at once on its memory."""
    host_link(gpu_name)
    return psi * CPU_ADAM_BYTES * sharing / HOSTS[gpu_name][2]


def time_terms(model, layout, rec, gpu_name: str, m: int, forward_s: float,
               backward_s: float, delayed: bool = False, sharing: int = 1) -> dict:
    """Seconds a step's offload adds (module docstring), by term: pcie_down, pcie_params,
    cpu_adam, pcie_up; forward_s, backward_s: one micro-batch's on the GPU; sharing: the GPUs
    of a node whose CPU steps share its memory."""
    mode = check(layout.offload)
    psi = model.params(layout.tp)
    link = host_link(gpu_name)
    down = psi * rec.grad / link
    out = dict(pcie_down=0.0, pcie_params=0.0, cpu_adam=cpu_adam_s(psi, gpu_name, sharing),
               pcie_up=0.0)
    if mode == "none":
        return dict.fromkeys(out, 0.0)
    if mode == "params":
        up = psi * rec.param / link
        out["pcie_params"] = m * (max(0.0, up - forward_s) + max(0.0, max(up, down)
                                                                  - backward_s))
    else:
        out["pcie_down"] = m * max(0.0, down - backward_s)
        out["pcie_up"] = psi * rec.param / link
    if delayed:  # the CPU step and the upload hide behind the next step's GPU work
        gpu = m * (forward_s + backward_s) + out["pcie_down"] + out["pcie_params"]
        late = max(0.0, out["cpu_adam"] + out["pcie_up"] - gpu)
        out["cpu_adam"], out["pcie_up"] = late, 0.0
    return out


def describe(model, layout, rec, gpu_name: str, m: int, forward_s: float, backward_s: float,
             host_memory: float, sharing: int = 1) -> list[str]:
    """The offload's lines for a plan report: host memory by term, each transfer and whether
    it hides, the CPU step."""
    mode = check(layout.offload)
    psi = model.params(layout.tp)
    link = host_link(gpu_name)
    host = host_bytes(model, layout, rec)
    name = {"optimizer": "optimizer (ZeRO-Offload: master weights, Adam states and gradients "
            "in host memory, Adam on the CPU)", "params": "parameters and optimizer "
            "(ZeRO-Infinity: parameters streamed over PCIe each forward and backward)"}[mode]
    down = psi * rec.grad / link
    lines = [f"  offload: {name}",
             f"  host memory {sum(host.values()) / GIB:.1f} GiB of {host_memory / GIB:.3g} = "
             + " + ".join(f"{k} {v / GIB:.1f}" for k, v in host.items()),
             f"  PCIe {link / 1e9:.0f} GB/s a direction: gradients down {down:.3g} s a "
             f"micro-batch against its backward {backward_s:.3g} s ("
             + ("hidden" if down <= backward_s else "exposed") + ")"]
    if mode == "params":
        up = psi * rec.param / link
        lines.append(f"  parameters up {up:.3g} s before each forward ({forward_s:.3g} s) and "
                     "each backward: " + ("hidden" if up <= min(forward_s, backward_s)
                                          else "partly exposed"))
    else:
        lines.append(f"  parameters up {psi * rec.param / link:.3g} s after the CPU step "
                     "(exposed)")
    what, rate = HOSTS[gpu_name][1:]
    share = f" / {sharing} GPUs" if sharing > 1 else ""
    lines.append(f"  CPU Adam {psi / 1e9:.2f}B parameters x {CPU_ADAM_BYTES} bytes at "
                 f"{rate / 1e9:.1f} GB/s{share} ({what}) = "
                 f"{cpu_adam_s(psi, gpu_name, sharing):.3g} s after the backward")
    now = time_terms(model, layout, rec, gpu_name, m, forward_s, backward_s, False, sharing)
    late = time_terms(model, layout, rec, gpu_name, m, forward_s, backward_s, True, sharing)
    lines.append(f"  (ZeRO-Offload's one-step delayed parameter update would hide "
                 f"{sum(now.values()) - sum(late.values()):.3g} s of it behind the next step)")
    return lines


def variants(rows, modes, model, rec, host_memory: float):
    """For each (Layout, m) the planner tries, one per offload mode in `modes`: (the layout
    offloading, m), or (it, why not) where it cannot offload or the host cannot hold it."""
    for layout, m in rows:
        for mode in modes:
            lay = replace(layout, offload=check(mode))
            why = None if mode == "none" or isinstance(m, str) else problem(lay)
            if why is None and mode != "none" and not isinstance(m, str):
                need = sum(host_bytes(model, lay, rec).values())
                if need > host_memory:
                    what = "optimizer" if mode == "optimizer" else "parameters and optimizer"
                    why = (f"host memory: offloading the {what} needs {need / GIB:.1f} GiB of "
                           f"host memory a GPU, more than the {host_memory / GIB:.3g} GiB given "
                           "(--host-memory-gb)")
            yield lay, (why if why is not None else m)
