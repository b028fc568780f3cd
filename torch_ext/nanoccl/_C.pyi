"""Type stubs of nanoccl._C (torch_ext/module.cc)."""

from typing import Any

from torch._C._distributed_c10d import Backend, Store

class ProcessGroupNanoccl(Backend):
    def stats(self) -> Any: ...
    def link_profile(self) -> Any: ...
    def predict_allreduce(self, count: int, dtype: Any, codec: str = "") -> tuple[str, str, float, int]: ...
    @property
    def comm_id(self) -> str: ...

def create_backend(
    store: Store,
    rank: int,
    size: int,
    timeout_ms: int,
    group_name: str,
    global_ranks: list[int],
    settings: dict[str, str],
) -> ProcessGroupNanoccl: ...
def check_setting(name: str, value: str) -> None: ...
def default_settings() -> list[tuple[str, str]]: ...
def load_link_profile(path: str) -> Any: ...
def link_profile_path(settings: dict[str, str]) -> str: ...
def predict_collective(
    op: str,
    count: int,
    dtype: str,
    nodes: int,
    procs_per_node: int,
    profile: str,
    codec: str = "",
    crossing: int = 1,
    settings: dict[str, str] = ...,
) -> tuple[str, str, float, float]: ...
def measure_cpu_rates() -> str: ...
