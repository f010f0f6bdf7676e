"""The profile document: pydantic models that reject unknown keys.

One model describes both a single file and the merged result of an `extends:` chain. Fields a
child may leave to its parent (the GPU count, the model) are optional here; `validate()` says
when the merged profile still lacks them, naming the file to put them in.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1

# The marker line above the toolkit-written block; everything above it is the author's.
RESULTS_MARKER = "# --- results: written by toolkit, do not edit below this line ---"

# Secret references: where the deployer reads the API key from. A literal key is refused.
SECRET_SCHEMES = ("env", "vault", "file")

# The variable the systemd unit's EnvironmentFile defines; the argv expands it, so the key
# itself never appears in a unit, a profile or a rendered command.
API_KEY_ENV = "SGLANG_API_KEY"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class Target(_Strict):
    """The hardware the profile is tuned for (per node)."""

    gpu_model: str | None = None
    gpu_count: int | None = Field(default=None, ge=1, description="GPUs per node")
    compute_capability: str | None = Field(default=None, pattern=r"^SM\d{2,3}$", description="e.g. SM120")
    interconnect: Literal["pcie", "nvlink"] | None = None
    p2p: bool | None = Field(default=None, description="whether GPUs can reach each other peer-to-peer")
    nodes: int = Field(default=1, ge=1)
    gpu_power_limit_w: float | None = Field(default=None, gt=0, description="board power limit per GPU, W (the "
                                            "board's default limit: what the GPU draws at most unless "
                                            "gpu.power_limit_w sets another)")
    # The range `nvidia-smi -pl` accepts on this board (nvidia-smi -q -d POWER: Min / Max Power Limit). Used to
    # refuse a gpu.power_limit_w outside it before anything runs; the host role checks the GPU's own range again.
    gpu_power_limit_min_w: float | None = Field(default=None, gt=0, description="lowest settable limit per GPU, W")
    gpu_power_limit_max_w: float | None = Field(default=None, gt=0, description="highest settable limit per GPU, W")
    gpu_memory_gib: float | None = Field(default=None, gt=0)

    @property
    def sm(self) -> int | None:
        return int(self.compute_capability[2:]) if self.compute_capability else None


class Patch(_Strict):
    """A change to a file of the installed SGLang, applied by the deploy role with `patch -p1`."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    target: str = Field(description="file relative to site-packages, e.g. sglang/srt/model_executor/model_runner.py")
    target_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the unpatched file it expects")
    patch: str = Field(description="patch file, relative to the repository root (profiles/patches/...)")
    reason: str
    link: str


class Engine(_Strict):
    sglang_version: str | None = Field(default=None, pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    requirements: str | None = Field(default=None, description="requirements lock for the venv, repo-relative")
    venv_path: str = "/opt/sglang/venv"
    patches: list[Patch] = Field(default_factory=list)


class ModelSpec(_Strict):
    repo_id: str | None = Field(default=None, pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str | None = None
    served_model_name: str | None = None
    quantization: str | None = None
    trust_remote_code: bool = False
    local_path: str | None = None
    architecture: str | None = Field(default=None, description="HF architectures[0], e.g. GlmMoeDsaForCausalLM")


class Server(_Strict):
    """Typed SGLang knobs. None means: leave SGLang's default, render no flag."""

    # Parallelism
    tp_size: int = Field(default=1, ge=1)
    pp_size: int = Field(default=1, ge=1)
    ep_size: int = Field(default=1, ge=1)
    dp_size: int = Field(default=1, ge=1)
    enable_dp_attention: bool = False
    nnodes: int = Field(default=1, ge=1)
    node_rank: int | None = Field(default=None, ge=0)
    dist_init_addr: str | None = None
    # Attention
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    nsa_prefill_backend: str | None = None
    nsa_decode_backend: str | None = None
    # MoE and communication
    moe_runner_backend: str | None = None
    flashinfer_autotune: bool = True
    allreduce_fusion: bool = False
    # Scheduler and memory
    max_running_requests: int | None = Field(default=None, ge=1)
    chunked_prefill_size: int | None = Field(default=None, ge=-1)
    num_continuous_decode_steps: int | None = Field(default=None, ge=1)
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    kv_cache_dtype: str | None = None
    # Graphs and cache
    cuda_graph: bool = True
    cuda_graph_max_bs: int | None = Field(default=None, ge=1)
    radix_cache: bool = True
    # Serving
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    enable_metrics: bool = False
    api_key_secret: str | None = Field(default=None, description="a reference: env:NAME, vault:NAME or file:PATH")
    # A bind other than loopback without an API key serves every endpoint to the network; only this key,
    # with its own why, turns that error into a warning (rules.py: public-bind-without-api-key).
    allow_unauthenticated: bool = Field(
        default=False,
        description="serve a non-loopback host without an API key (needs why.server.allow_unauthenticated)",
    )
    extra_args: list[str] = Field(default_factory=list)


class SteadyState(_Strict):
    plateau_fraction: float = Field(default=0.8, gt=0, le=1)
    smooth_s: float = Field(default=2.0, gt=0)
    min_window_s: float = Field(default=5.0, gt=0)


class Slo(_Strict):
    """The latency the service is held to, in ms: the 99th percentile over the benchmark's requests (from its
    per-request results, not from means). Any subset; at least one."""

    ttft_p99_ms: float | None = Field(default=None, gt=0, description="time to first token, p99, ms")
    itl_p99_ms: float | None = Field(default=None, gt=0, description="inter-token latency, p99 over all gaps, ms")
    e2e_p99_ms: float | None = Field(default=None, gt=0, description="end-to-end request latency, p99, ms")

    @model_validator(mode="after")
    def _one_bound(self) -> Slo:
        if self.ttft_p99_ms is None and self.itl_p99_ms is None and self.e2e_p99_ms is None:
            raise ValueError("an slo needs at least one of ttft_p99_ms, itl_p99_ms, e2e_p99_ms")
        return self


class Bench(_Strict):
    """SGLang's bench_serving run. Defaults are the seed's command (DOMAIN.md section 1)."""

    backend: str = "sglang-oai"
    dataset_name: str = "random"
    random_input_len: int = Field(default=256, ge=1)
    random_output_len: int = Field(default=128, ge=1)
    random_range_ratio: float | None = Field(default=None, ge=0, le=1)
    num_prompts: int = Field(default=1024, ge=1)
    request_rate: float | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(default=None, ge=1)
    concurrency_levels: list[int] = Field(default_factory=list)
    warmup_requests: int | None = Field(default=None, ge=0)
    seed: int | None = None
    tokenizer: str | None = Field(default=None, description="None: model.repo_id")
    # What `toolkit tune --objective goodput` and `toolkit sweep --objective goodput` hold each variant to
    # (--slo on the command line wins). It renders nothing: bench_serving measures, the toolkit judges.
    slo: Slo | None = None

    @field_validator("concurrency_levels")
    @classmethod
    def _positive_levels(cls, v: list[int]) -> list[int]:
        if any(level < 1 for level in v):
            raise ValueError("every concurrency level must be >= 1")
        return v


class Gpu(_Strict):
    """Settings of the GPUs themselves, applied on the host that owns them (a container cannot set them)."""

    # nvidia-smi -pl / nvmlDeviceSetPowerManagementLimit on every GPU of the host, kept across reboots by a unit
    # (roles/proxmox_gpu_host, tasks/power_limit.yml). None: the host's limits are left as they are.
    power_limit_w: float | None = Field(default=None, gt=0, description="enforced power limit per GPU, W")


class Probe(_Strict):
    idle_s: float = Field(default=10, ge=0)
    sample_hz: float = Field(default=10, gt=0, le=100)
    # SGLang's /metrics and /v1/loads scrapes per second (server_trace.csv). Its gauges change at most at each
    # prefill batch and every decode_log_interval (40) decode steps, so faster only repeats values; AIPerf
    # scrapes at 3 Hz.
    server_scrape_hz: float = Field(default=2.0, gt=0, le=20)
    steady_state: SteadyState = Field(default_factory=SteadyState)


class Why(_Strict):
    reason: str
    link: str | None = None


class ResultsEnvelope(BaseModel):
    """The toolkit-written block below RESULTS_MARKER as the profile sees it: only its envelope. The block's
    writer (toolkit.core.results: its ResultsBlock) owns the full schema and migrations, so a newer block never
    blocks a profile."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 1
    keep_last: int = Field(default=10, ge=1)
    entries: list[dict[str, Any]] = Field(default_factory=list)


class Profile(_Strict):
    schema_version: int
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    extends: str | None = None
    target: Target = Field(default_factory=Target)
    engine: Engine = Field(default_factory=Engine)
    model: ModelSpec = Field(default_factory=ModelSpec)
    server: Server = Field(default_factory=Server)
    env: dict[str, str] = Field(default_factory=dict)
    gpu: Gpu = Field(default_factory=Gpu)
    bench: Bench = Field(default_factory=Bench)
    probe: Probe = Field(default_factory=Probe)
    why: dict[str, Why] = Field(default_factory=dict)
    results: ResultsEnvelope | None = None

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v > SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is newer than this toolkit understands ({SCHEMA_VERSION})")
        if v < 1:
            raise ValueError("schema_version starts at 1")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key.replace("_", "").isalnum() or key[0].isdigit():
                raise ValueError(f"{key!r} is not an environment variable name")
        return v
