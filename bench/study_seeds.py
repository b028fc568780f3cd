"""The published numbers the study report stands beside (the seed documents of the project's founding design).

Sources (the seed documents, as text extracted from slides, a paper and blog posts):

- NANO: "You've got a few GPUs, now what?!" (slides; 2 x Dell R7525, 2 x A40 per node on
  PCIe Gen4, nodes on 1 GbE; ColossalAI 0.4.9 + NCCL 2.26). ResNet-18 / CIFAR-10 (DP,
  batch 32..2048) and GPT-2 small / Wikitext-2 (DP, TP, PP, batch 4..16). Table on slides
  18/19: sample throughput (ktokens/s), scaling factor S_n = T_n / (n T_1), network
  throughput (Gb/s, full duplex) and network volume (GB per run).
- PCIE: "Distributed Training Strategies on Commodity Hardware" (paper; RTX A6000 on PCIe,
  Megatron-Core + DeepSpeed, 10M..1B models, 1/2/4 GPUs, DP/TP/PP and ZeRO 1/2/3).
- NET: "The Impact of GPU Networking (Part 1)" (blog; A100, DDP, GPT-2 85M and 708M;
  NVLink inside a node, InfiniBand HDR between nodes).
- WILL-IT-SCALE (blog) and HIGH-BANDWIDTH (article): qualitative only (comm <= compute).

The slide table was OCR'd twice in the seed text; the two renderings agree except for
DP 2x1's volume (223.40 in one, "22_5.10" in the other): 223.40 is kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedRow:
    setup: str  # "1x2" = 1 server x 2 GPUs
    parallelism: str  # dp, tp, pp
    ktokens_per_s: float
    scaling: float
    net_gbps: float | None  # Gb/s, full duplex, measured at the NIC
    net_volume_gb: float | None  # GB per run


NANO_SOURCE = ("nano-cluster study (slides 18/19): 2 nodes x 2 A40 (PCIe Gen4), 1 GbE, "
               "ColossalAI + NCCL, GPT-2 small")

# GPT-2 small on the nano-cluster (slides 18/19).
NANO_GPT2_SMALL: tuple[PublishedRow, ...] = (
    PublishedRow("1x2", "dp", 55.01, 0.93, None, None),
    PublishedRow("1x2", "tp", 25.83, 0.44, None, None),
    PublishedRow("1x2", "pp", 22.93, 0.39, None, None),
    PublishedRow("2x1", "dp", 6.73, 0.11, 1.63, 223.40),
    PublishedRow("2x1", "tp", 1.46, 0.02, 1.81, 1171.06),
    PublishedRow("2x1", "pp", 7.94, 0.13, 1.39, 174.26),
    PublishedRow("2x2", "dp", 10.34, 0.09, 1.66, 149.17),
    PublishedRow("2x2", "tp", 1.46, 0.01, 1.81, 1171.79),
    PublishedRow("2x2", "pp", 8.87, 0.08, 1.53, 174.31),
)


def nano_row(setup: str, parallelism: str) -> PublishedRow | None:
    for row in NANO_GPT2_SMALL:
        if row.setup == setup and row.parallelism == parallelism:
            return row
    return None


def _derived_t1() -> float:
    """The 1x1 throughput (ktokens/s) the 1x2 rows imply: T_1 = T_2 / (2 S_2)."""
    rows = [r for r in NANO_GPT2_SMALL if r.setup == "1x2"]
    return sum(r.ktokens_per_s / (2 * r.scaling) for r in rows) / len(rows)


# One A40 on GPT-2 small: 29.5 ktokens/s (DP 29.6, TP 29.4, PP 29.4 from the 1x2 rows).
NANO_GPT2_SMALL_1X1_KTOK = _derived_t1()

# ResNet-18 (slides 13/14): 1x2 scales best (S up to ~0.9), 2x2 is only ~16% faster than
# 1x2, peak ~13k images/s in 2x2 at batch 2048. Together: T_1 ~ 13k / (1.16 x 2 x 0.9).
NANO_RESNET_PEAK_2X2 = 13_000.0
NANO_RESNET_S_1X2 = 0.9
NANO_RESNET_2X2_OVER_1X2 = 1.16
NANO_RESNET_1X1_IMG_S = NANO_RESNET_PEAK_2X2 / (NANO_RESNET_2X2_OVER_1X2 * 2 * NANO_RESNET_S_1X2)

# PP on GPT-2 small -> XL (slide 20): network volume per run grows 174 GB -> 330 GB.
NANO_PP_VOLUME_GB = {"gpt2-small": 174.0, "gpt2-xl": 330.0}

NANO_FINDINGS = (
    "DP scales well inside a node (S ~0.9 ResNet-18, 0.93 GPT-2 small at 1x2)",
    "across 2 nodes on 1 GbE GPT-2 DP collapses to S = 0.11 (2x1) / 0.09 (2x2)",
    "TP is worst across nodes (S 0.01-0.02, ~1170 GB per run, the link saturated at 1.81 Gb/s)",
    "PP holds best across nodes (7.9-8.9 ktokens/s, S 0.13 / 0.08, ~174 GB per run)",
    "2x2 is only ~16% faster than 1x2 for ResNet-18",
)

# The PCIe paper (A6000, Megatron / DeepSpeed): qualitative results used by the report.
PCIE_FINDINGS = (
    "on 2 GPUs only DP (> 80% efficiency) and ZeRO-1 scale; TP ~60%, PP poor (m = p microbatches)",
    "ZeRO-2 is slower than ZeRO-1 (many small reduce-scatters on the critical path); "
    "ZeRO-3 is comparable to ZeRO-1",
    "on 4 GPUs behind several PCIe bridges most strategies scale negatively",
)


@dataclass(frozen=True)
class NetRow:
    model: str
    nodes: int
    gpus_per_node: int
    epoch2_s: float


# "The Impact of GPU Networking" (A100; NVLink in a node, InfiniBand HDR across nodes).
NET_DDP: tuple[NetRow, ...] = (
    NetRow("gpt2 (85M)", 1, 1, 157.60), NetRow("gpt2 (85M)", 1, 2, 62.96),
    NetRow("gpt2 (85M)", 2, 1, 62.55),
    NetRow("gpt2-large (708M)", 1, 1, 498.37), NetRow("gpt2-large (708M)", 1, 2, 266.83),
    NetRow("gpt2-large (708M)", 2, 1, 406.12),
)


def net_scaling(model: str, nodes: int, gpus: int) -> float | None:
    """S_2 = T_2 / (2 T_1) from the blog's epoch times (throughput ~ 1 / epoch time)."""
    base = next((r for r in NET_DDP if r.model == model and r.nodes * r.gpus_per_node == 1), None)
    row = next((r for r in NET_DDP if r.model == model and r.nodes == nodes
                and r.gpus_per_node == gpus), None)
    if base is None or row is None:
        return None
    return base.epoch2_s / (nodes * gpus * row.epoch2_s)


@dataclass(frozen=True)
class DilationReference:
    """A published single-GPU operating point whose compute-to-communication ratio the
    emulated cluster keeps (see bench/study.py, time dilation)."""

    name: str
    model_family: str  # "gpt" or "resnet"
    samples_per_s: float  # 1x1 throughput in samples (sequences / images) per second
    global_batch: int
    params: float
    grad_bytes_per_param: int
    link_bits: float  # the reference's inter-node line rate

    @property
    def step_s(self) -> float:
        return self.global_batch / self.samples_per_s

    @property
    def comm_s(self) -> float:
        """Time to move one copy of the gradients over the reference link."""
        return self.params * self.grad_bytes_per_param * 8 / self.link_bits

    @property
    def ratio(self) -> float:
        """Compute time per step over gradient transfer time (the ratio to keep)."""
        return self.step_s / self.comm_s


DILATION_REFERENCES = {
    # GPT-2 small on one A40 at batch 16 x 1024 tokens (the table's peak batch), fp32
    # gradients (124.4 M parameters, tied embedding), 1 GbE between nodes.
    "gpt": DilationReference("A40, GPT-2 small, batch 16 x 1024, 1 GbE (nano-cluster study)",
                             "gpt", NANO_GPT2_SMALL_1X1_KTOK * 1000 / 1024, 16, 124.44e6, 4, 1e9),
    # ResNet-18 on one A40 at batch 2048, fp32 gradients (11.17 M parameters), 1 GbE.
    "resnet": DilationReference("A40, ResNet-18, batch 2048, 1 GbE (nano-cluster study)",
                                "resnet", NANO_RESNET_1X1_IMG_S, 2048, 11.17e6, 4, 1e9),
}
