"""vLLM's internals are reached from one module only (`tts/backends/vllm_internals.py`), so
a vLLM version bump is one place to change. The check reads the code (attributes and
imports), not comments or docstrings."""

import ast
from pathlib import Path

import tts

ROOT = Path(tts.__file__).parent
HOME = ROOT / "backends" / "vllm_internals.py"
# vLLM's parts that are not public API: the in-process engine core and its executor, the
# scheduler's admission and counters, the KV cache manager's usage and config, the renderer
INTERNAL_ATTRS = {"engine_core", "model_executor", "driver_worker", "renderer", "render_cmpl",
                  "max_num_active_reqs", "max_num_running_reqs", "get_request_counts",
                  "kv_cache_config", "kv_cache_tensors", "num_gpu_blocks", "max_num_scheduled_tokens"}
INTERNAL_MODULES = ("vllm.v1", "vllm.config", "vllm.logger")


def uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(INTERNAL_MODULES):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Constant) and node.value in INTERNAL_ATTRS:  # getattr(x, "engine_core")
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_vllm_internals_are_reached_from_one_module() -> None:
    outside = [use for path in sorted(ROOT.rglob("*.py")) if path != HOME for use in uses(path)]
    assert not outside, "vLLM internals outside tts/backends/vllm_internals.py:\n" + "\n".join(outside)
    assert len(uses(HOME)) >= len(INTERNAL_ATTRS) // 2  # the check sees what it looks for
