"""Every CUDA card's device profile: the card's `conf/device` profile where it has one, else
its row of a datasheet table of the common data-centre and workstation cards, else an
estimate from the card's own properties, labelled as one.

Matched by the name torch gives the card (`torch.cuda.get_device_name`). This module is the
model only: the properties are read from torch by `tts.profiling.gpu`, which also measures
a card (`tts profile-memory --calibrate`) where an estimate is all there is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tts.memory.device import DeviceProfile, StepEfficiency, load_device

# CUDA device names -> the profile in conf/device, which holds one variant's datasheet
# numbers (H100 SXM, H200 SXM, A100 80GB SXM, RTX 4090) and its step efficiencies. The
# other variants (PCIe and NVL cards, the 40 GB A100) are rows of DATASHEETS.
GPU_PROFILES: tuple[tuple[str, str], ...] = (
    (r"\bH200\b(?!.*\bNVL\b)", "h200"),  # "NVIDIA H200" (not GH200: Grace Hopper is another memory system)
    (r"\bH100\b(?!.*\b(PCIe|NVL)\b)", "h100"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100\b(?!.*(PCIe|40GB))", "a100"),  # "NVIDIA A100-SXM4-80GB"
    (r"\bRTX 4090\b(?!\s*(D\b|Laptop))", "rtx4090"),  # "NVIDIA GeForce RTX 4090"
)


@dataclass(frozen=True)
class Datasheet:
    """One card's datasheet numbers."""

    pattern: str
    """Regular expression on the card's CUDA name, case-insensitive; no two rows match one name."""
    name: str
    """The profile's name (`device.name` in a run's config)."""
    cc: tuple[int, int]
    """Compute capability: the architecture, whose cards' lowest bandwidth an estimate
    assumes where torch does not give a card's memory clock (`estimate_profile`)."""
    peak_tflops: float
    """Dense bf16 tensor TFLOP/s with FP32 accumulate, no 2:4 sparsity (fp16 on Volta and
    Turing, which have no bf16): a datasheet's figure with sparsity is halved."""
    bandwidth_gbs: float
    memory_gb: float
    source: str
    """The datasheet, the figures as it gives them, and its address."""


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/hpc-datasheet-sc23-h200"
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"

DATASHEETS: tuple[Datasheet, ...] = (
    # H100 datasheet: H100 PCIe BF16 1,513 TFLOPS with sparsity -> 756.5 dense; 2 TB/s; 80 GB HBM2e
    Datasheet(r"\bH100\b.*\bPCIe\b", "h100_pcie", (9, 0), 756.5, 2000.0, 80.0,
              "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): BF16 1,513 TFLOPS with sparsity = 756.5 dense, "
              f"2 TB/s, 80 GB; {_H100}"),
    # H100 datasheet: H100 NVL (one GPU) BF16 1,671 TFLOPS with sparsity -> 835.5 dense; 3.9 TB/s; 94 GB HBM3
    Datasheet(r"\bH100\b.*\bNVL\b", "h100_nvl", (9, 0), 835.5, 3900.0, 94.0,
              "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL, per GPU): BF16 1,671 TFLOPS with sparsity = 835.5 dense, "
              f"3.9 TB/s, 94 GB; {_H100}"),
    # H200 datasheet: H200 NVL BF16 1,671 TFLOPS with sparsity -> 835.5 dense; 4.8 TB/s; 141 GB HBM3e
    Datasheet(r"\bH200\b.*\bNVL\b", "h200_nvl", (9, 0), 835.5, 4800.0, 141.0,
              "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL): BF16 1,671 TFLOPS with sparsity = 835.5 dense, "
              f"4.8 TB/s, 141 GB; {_H200}"),
    # A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity) on every A100; 40GB SXM 1,555 GB/s
    Datasheet(r"\bA100\b(?=.*\bSXM)(?=.*40GB)", "a100_40gb", (8, 0), 312.0, 1555.0, 40.0,
              "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM): BF16 312 TFLOPS dense, "
              f"1,555 GB/s, 40 GB HBM2; {_A100}"),
    # A100 datasheet: A100 40GB PCIe 1,555 GB/s ("NVIDIA A100-PCIE-40GB")
    Datasheet(r"\bA100\b(?=.*PCIe)(?=.*40GB)", "a100_pcie_40gb", (8, 0), 312.0, 1555.0, 40.0,
              "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB PCIe): BF16 312 TFLOPS dense, "
              f"1,555 GB/s, 40 GB HBM2; {_A100}"),
    # A100 datasheet: A100 80GB PCIe 1,935 GB/s ("NVIDIA A100 80GB PCIe")
    Datasheet(r"\bA100\b(?=.*PCIe)(?!.*40GB)", "a100_pcie", (8, 0), 312.0, 1935.0, 80.0,
              "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB PCIe): BF16 312 TFLOPS dense, "
              f"1,935 GB/s, 80 GB HBM2e; {_A100}"),
    # A30 datasheet: BF16 165 TFLOPS dense (330 with sparsity); 933 GB/s; 24 GB HBM2
    Datasheet(r"\bA30\b", "a30", (8, 0), 165.0, 933.0, 24.0,
              "NVIDIA A30 Tensor Core GPU datasheet: BF16 Tensor Core 165 TFLOPS dense (330 with sparsity), 933 GB/s, "
              "24 GB HBM2; https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/"
              "a30-datasheet.pdf"),
    # A10 datasheet: BF16 125 TFLOPS dense (250 with sparsity); 600 GB/s; 24 GB GDDR6
    Datasheet(r"\bA10\b", "a10", (8, 6), 125.0, 600.0, 24.0,
              "NVIDIA A10 Tensor Core GPU datasheet: BF16 Tensor Core 125 TFLOPS dense (250 with sparsity), 600 GB/s, "
              "24 GB GDDR6; https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/"
              "nvidia-a10-datasheet.pdf"),
    # A10G (AWS G5 only): NVIDIA publishes no datasheet. 80 SMs at 1,710 MHz with half-rate
    # FP32-accumulate tensor math (as GeForce Ampere) is 70 TFLOPS; 600 GB/s; 24 GB GDDR6
    Datasheet(r"\bA10G\b", "a10g", (8, 6), 70.0, 600.0, 24.0,
              "no NVIDIA datasheet (an AWS-only part, EC2 G5): BF16 tensor 70 TFLOPS dense as Baseten's A10 vs A10G "
              "spec table gives it (80 SMs x 512 FLOP/clock at 1,710 MHz), 600 GB/s, 24 GB GDDR6; "
              "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/"),
    # A40 datasheet: BF16 149.7 TFLOPS dense (299.4 with sparsity); 696 GB/s; 48 GB GDDR6
    Datasheet(r"\bA40\b", "a40", (8, 6), 149.7, 696.0, 48.0,
              "NVIDIA A40 datasheet: BF16 Tensor Core 149.7 TFLOPS dense (299.4 with sparsity), 696 GB/s, 48 GB GDDR6; "
              "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"),
    # RTX A6000 datasheet: tensor 309.7 TFLOPS with sparsity -> 154.8 dense; 768 GB/s; 48 GB GDDR6
    Datasheet(r"\bRTX A6000\b", "rtx_a6000", (8, 6), 154.8, 768.0, 48.0,
              f"NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX A6000: peak BF16 tensor 154.8 TFLOPS dense "
              f"(309.7 with sparsity), 768 GB/s, 48 GB GDDR6; {_GA102}"),
    # GA102 whitepaper: RTX 3090 BF16 with FP32 accumulate 71 TFLOPS dense (142 with sparsity); 936 GB/s; 24 GB GDDR6X
    Datasheet(r"\bRTX 3090\b(?!\s*Ti)", "rtx3090", (8, 6), 71.0, 936.0, 24.0,
              f"NVIDIA Ampere GA102 GPU Architecture whitepaper, GeForce RTX 3090: peak BF16 tensor with FP32 "
              f"accumulate 71 TFLOPS dense (142 with sparsity), 936 GB/s, 24 GB GDDR6X; {_GA102}"),
    # L4 datasheet: BF16 242 TFLOPS with sparsity -> 121 dense; 300 GB/s; 24 GB GDDR6
    Datasheet(r"\bL4\b", "l4", (8, 9), 121.0, 300.0, 24.0,
              "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity = 121 dense, 300 GB/s, "
              "24 GB GDDR6; https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"),
    # L40 datasheet: BF16 181.05 TFLOPS dense (362.1 with sparsity); 864 GB/s; 48 GB GDDR6
    Datasheet(r"\bL40\b", "l40", (8, 9), 181.05, 864.0, 48.0,
              "NVIDIA L40 GPU datasheet: BF16 Tensor Core 181.05 TFLOPS dense (362.1 with sparsity), 864 GB/s, "
              "48 GB GDDR6; https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf"),
    # L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity); 864 GB/s; 48 GB GDDR6
    Datasheet(r"\bL40S\b", "l40s", (8, 9), 362.05, 864.0, 48.0,
              "NVIDIA L40S GPU datasheet: BF16 Tensor Core 362.05 TFLOPS dense (733 with sparsity), 864 GB/s, "
              "48 GB GDDR6; https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    # RTX 6000 Ada datasheet: tensor 1,457 TFLOPS is FP8 with sparsity -> BF16 dense a quarter, 364.2; 960 GB/s; 48 GB
    Datasheet(r"\bRTX 6000 Ada\b", "rtx6000_ada", (8, 9), 364.2, 960.0, 48.0,
              "NVIDIA RTX 6000 Ada Generation datasheet: tensor performance 1,457 TFLOPS (FP8 with sparsity) = 364.2 "
              "BF16 dense, 960 GB/s, 48 GB GDDR6; https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/"
              "rtx-6000/proviz-print-rtx6000-datasheet-web-2504660.pdf"),
    # V100 datasheet: tensor (FP16, no bf16 on Volta, no sparsity) SXM2 125 TFLOPS, PCIe 112, V100S 130; 900 GB/s (V100S 1,134)
    Datasheet(r"\bV100S\b", "v100s", (7, 0), 130.0, 1134.0, 32.0,
              "NVIDIA V100 Tensor Core GPU datasheet (V100S PCIe): tensor 130 TFLOPS (FP16), 1,134 GB/s, 32 GB HBM2; "
              + _V100),
    Datasheet(r"\bV100\b(?=.*SXM2)(?=.*32GB)", "v100_sxm2_32gb", (7, 0), 125.0, 900.0, 32.0,
              "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2 32GB): tensor 125 TFLOPS (FP16), 900 GB/s, 32 GB HBM2; "
              + _V100),
    Datasheet(r"\bV100\b(?=.*SXM2)(?!.*32GB)", "v100_sxm2", (7, 0), 125.0, 900.0, 16.0,
              "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2 16GB): tensor 125 TFLOPS (FP16), 900 GB/s, 16 GB HBM2; "
              + _V100),
    Datasheet(r"\bV100\b(?=.*PCIe)(?=.*32GB)", "v100_pcie_32gb", (7, 0), 112.0, 900.0, 32.0,
              "NVIDIA V100 Tensor Core GPU datasheet (V100 PCIe 32GB): tensor 112 TFLOPS (FP16), 900 GB/s, 32 GB HBM2; "
              + _V100),
    Datasheet(r"\bV100\b(?=.*PCIe)(?!.*32GB)", "v100_pcie", (7, 0), 112.0, 900.0, 16.0,
              "NVIDIA V100 Tensor Core GPU datasheet (V100 PCIe 16GB): tensor 112 TFLOPS (FP16), 900 GB/s, 16 GB HBM2; "
              + _V100),
    # T4 datasheet: mixed precision (FP16/FP32, no bf16 on Turing) 65 TFLOPS, no sparsity; 320+ GB/s; 16 GB GDDR6
    Datasheet(r"\bT4\b", "t4", (7, 5), 65.0, 320.0, 16.0,
              "NVIDIA T4 Tensor Core GPU datasheet: mixed precision (FP16/FP32) 65 TFLOPS, 320+ GB/s (256-bit GDDR6 at "
              "10 Gbps), 16 GB GDDR6; https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
              "t4-tensor-core-datasheet-951643.pdf"),
)


def _borrowed(card: str) -> StepEfficiency | None:
    """The h100 profile's measured step efficiencies, for a card never measured (as the a100
    and rtx4090 profiles borrow them: every GPU of a what-if priced the same way)."""
    h100 = load_device("h100").efficiency
    if h100 is None:
        return None
    return replace(h100, source=f"borrowed from the h100 profile (no {card} measured): {h100.source}")


def gpu_by_name(gpu_name: str) -> DeviceProfile | None:
    """The profile of the CUDA card called `gpu_name`: its `conf/device` profile
    (`GPU_PROFILES`), else its datasheet row (`DATASHEETS`, with the h100's step
    efficiencies borrowed); None for a card neither knows (`estimate_profile`)."""
    for pattern, profile in GPU_PROFILES:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return load_device(profile)
    for row in DATASHEETS:
        if re.search(row.pattern, gpu_name, flags=re.IGNORECASE):
            return DeviceProfile(row.name, "gpu", row.peak_tflops, row.bandwidth_gbs, row.memory_gb, row.source,
                                 efficiency=_borrowed(row.name))
    return None


@dataclass(frozen=True)
class CardProperties:
    """What torch tells of a CUDA card (`torch.cuda.get_device_properties`); 0 where this
    torch does not say (CUDA 13 dropped the clocks from `cudaDeviceProp`)."""

    name: str
    major: int
    minor: int
    sm_count: int
    total_memory: int
    """Bytes."""
    clock_khz: int = 0
    """The SMs' peak clock."""
    memory_clock_khz: int = 0
    bus_width_bits: int = 0


# Dense tensor FLOPs an SM does each clock at bf16 (fp16 before Ampere) with FP32 accumulate,
# by compute capability: a datasheet peak over SMs x boost clock. A card of a capability not
# listed takes the nearest one below it.
FLOP_PER_CLOCK: dict[tuple[int, int], int] = {
    (6, 0): 256,  # Pascal, no tensor cores: fp16 at twice the FP32 rate of 64 cores
    (7, 0): 1024,  # Volta: V100 SXM2 125 TFLOPS = 80 SMs x 1,024 x 1.53 GHz
    (7, 5): 1024,  # Turing: T4 65 = 40 x 1,024 x 1.59
    (8, 0): 2048,  # Ampere GA100: A100 312 = 108 x 2,048 x 1.41
    (8, 6): 1024,  # Ampere GA10x: A10 125 = 72 x 1,024 x 1.695
    (8, 9): 1024,  # Ada: L4 121 = 58 x 1,024 x 2.04
    (9, 0): 4096,  # Hopper: H100 SXM 989 = 132 x 4,096 x 1.83
    (10, 0): 8192,  # Blackwell data-centre: B200 2,250 dense (4,500 with sparsity) = 148 x 8,192 x 1.86
    (12, 0): 1024,  # Blackwell RTX: RTX 5090 419 with FP16 accumulate = 170 x 1,024 x 2.41
}
# GeForce cards run bf16 with FP32 accumulate at half their tensor rate (NVIDIA's GA102 and
# Ada whitepapers: RTX 3090 71 against 142 TFLOPS, RTX 4090 165 against 330)
GEFORCE_SHARE = 0.5
ASSUMED_CLOCK_GHZ = 1.4  # below the boost clock of every card in the table (the A100's 1.41 GHz the lowest)


def estimate_profile(card: CardProperties) -> DeviceProfile:
    """A profile for a card no datasheet row describes, estimated from its own properties
    and labelled so in its name (`<card>_estimate`) and `source`: peak = SMs x the
    architecture's tensor FLOPs per clock (`FLOP_PER_CLOCK`, halved on GeForce) x its clock;
    bandwidth = memory clock x 2 (double data rate) x bus width; memory = the card's. Where
    torch gives no clock, `ASSUMED_CLOCK_GHZ`, and no memory clock, the lowest bandwidth of the
    table's cards of that architecture; each assumption said in `source`."""
    cc = (card.major, card.minor)
    arch = max((k for k in FLOP_PER_CLOCK if k <= cc), default=min(FLOP_PER_CLOCK))
    per_clock = FLOP_PER_CLOCK[arch] * (GEFORCE_SHARE if "geforce" in card.name.lower() else 1.0)
    if card.clock_khz > 0:
        ghz, clock = card.clock_khz / 1e6, f"its clock {card.clock_khz / 1e6:.2f} GHz"
    else:
        ghz, clock = ASSUMED_CLOCK_GHZ, f"{ASSUMED_CLOCK_GHZ} GHz ASSUMED (torch gives no clock)"
    peak = card.sm_count * per_clock * ghz / 1e3
    if card.memory_clock_khz > 0 and card.bus_width_bits > 0:
        bandwidth = card.memory_clock_khz * 1e3 * 2 * card.bus_width_bits / 8 / 1e9
        memory = (f"memory clock {card.memory_clock_khz / 1e6:.3f} GHz x 2 x {card.bus_width_bits}-bit bus "
                  f"= {bandwidth:.0f} GB/s")
    else:
        bandwidth, like = _assumed_bandwidth(cc)
        memory = f"{bandwidth:.0f} GB/s ASSUMED (torch gives no memory clock): the lowest of {like}"
    source = (f"ESTIMATED from the card's own properties, not a datasheet: {card.name}, compute capability "
              f"{card.major}.{card.minor}, {card.sm_count} SMs x {per_clock:g} tensor FLOP/clock "
              f"(compute capability {arch[0]}.{arch[1]}'s{', halved on GeForce' if per_clock < FLOP_PER_CLOCK[arch] else ''})"
              f" x {clock} = {peak:.1f} TFLOP/s; {memory}; {card.total_memory / 1e9:.1f} GB. "
              "Measure it with `tts profile-memory --calibrate`")
    return DeviceProfile(f"{card_slug(card.name)}_estimate", "gpu", round(peak, 1), round(bandwidth, 1),
                         round(card.total_memory / 1e9, 1), source, efficiency=_borrowed(card.name))


def card_slug(gpu_name: str) -> str:
    """A card's name as a profile name: "NVIDIA RTX PRO 6000" -> "rtx_pro_6000"."""
    return re.sub(r"[^a-z0-9]+", "_", gpu_name.lower()).strip("_").removeprefix("nvidia_") or "gpu"


def _assumed_bandwidth(cc: tuple[int, int]) -> tuple[float, str]:
    """The lowest bandwidth of the table's cards of compute capability `cc` (else of the
    nearest capability below it that has cards, else of the lowest one's), and what they are."""
    known = sorted({row.cc for row in DATASHEETS})
    arch = max((k for k in known if k <= cc), default=known[0])
    rows = [row for row in DATASHEETS if row.cc == arch]
    low = min(rows, key=lambda row: row.bandwidth_gbs)
    return low.bandwidth_gbs, f"the datasheet table's compute capability {arch[0]}.{arch[1]} cards ({low.name})"
