"""The profile document: pydantic models that reject unknown keys.

One model describes both a single file and the merged result of an `extends:` chain. Fields a
child may leave to its parent (the GPU count, the model) are optional here; `validate()` says
when the merged profile still lacks them, naming the file to put them in.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1

# The marker line above the toolkit-written block; everything above it is the author's.
RESULTS_MARKER = "# --- results: written by toolkit, do not edit below this line ---"

# Secret references: where the deployer reads the API key from. A literal key is refused.
SECRET_SCHEMES = ("env", "vault", "file")

# The variable the systemd unit's EnvironmentFile defines; the argv expands it, so the key
# itself never appears in a unit, a profile or a rendered command.
API_KEY_ENV = "SGLANG_API_KEY"


# Numbers by their meaning: strict, so a YAML 1.1 boolean (`port: yes`) is no number, 8.0 no GPU count and "8"
# no integer; finite, so .nan and .inf are no fraction, rate or limit.
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True, allow_inf_nan=False)


# Hardware bounds: no board draws more than this (the largest today, B300-class, is rated 1,400 W), none holds
# more memory (288 GB), and no one host more GPUs (NVLink domains of 72 span 18 hosts of 4).
MAX_BOARD_POWER_W = 2000
MAX_GPU_MEMORY_GIB = 1024
MAX_GPUS_PER_NODE = 64
MAX_NODES = 1024
# An idle baseline, a smoothing window or a steady window longer than an hour is a typo, not a measurement.
MAX_PROBE_WINDOW_S = 3600
# Request, token and batch counts: SGLang and bench_serving hold them in 32-bit integers (torch int32
# tensors, CUDA graph batch sizes), so a larger one is a typo that would fail only on the GPU host.
MAX_COUNT = 2**31 - 1
# bench_serving seeds numpy's generator with --seed, which takes 0 to 2**32 - 1 only.
MAX_BENCH_SEED = 2**32 - 1
# A latency bound longer than an hour is a typo, not a service level.
MAX_SLO_MS = 3_600_000

# Environment variable names as systemd and POSIX shells take them (env_name_is_valid): ASCII only.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Hugging Face repo ids (huggingface_hub validate_repo_id): ASCII word characters, '-' and '.', at most 96
# characters a part, a word character at each end; '--' and '..' are refused there (ModelSpec below), and '..'
# would climb out of the model cache here.
_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID = rf"^{_REPO_PART}/{_REPO_PART}$"


# An inventory host or group name as Ansible takes it in a pattern: no ',' or ':' (pattern separators), no
# wildcard, no '!' or '&' (pattern operators), nothing a shell or Jinja would read.
INVENTORY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$"

# Entries of a list or mapping of a profile (extra_args, env, why, acknowledge, patches, concurrency levels): a
# profile has tens; each entry is checked and may be reported, so their number bounds the work and the output.
MAX_ITEMS = 256
# A profile's name is its file's name without .yaml; a file name is at most 255 bytes (NAME_MAX).
PROFILE_NAME = r"^[a-z0-9][a-z0-9._-]*$"
MAX_PROFILE_NAME = 255 - len(".yaml")


class Target(_Strict):
    """The hardware the profile is tuned for (per node)."""

    gpu_model: str | None = None
    gpu_count: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs per node")
    compute_capability: str | None = Field(default=None, pattern=r"^SM\d{2,3}$", description="e.g. SM120")
    interconnect: Literal["pcie", "nvlink"] | None = None
    p2p: bool | None = Field(default=None, description="whether GPUs can reach each other peer-to-peer")
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    # Which inventory hosts a profile that spans nodes runs on, in node-rank order (node 0 first): each entry an
    # Ansible pattern (a host or a group of the inventory), as `--limit` takes them. Unset: the inventory's
    # gpu_containers in their order (narrowed by --limit), so a shipped profile names no site's hosts.
    hosts: list[Annotated[str, Field(pattern=INVENTORY_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=MAX_ITEMS,
        description="inventory hosts or groups, node 0 first (unset: gpu_containers)")
    gpu_power_limit_w: float | None = Field(
        default=None, gt=0, le=MAX_BOARD_POWER_W, description="board power limit per GPU, W (the board's default "
        "limit: what the GPU draws at most unless gpu.power_limit_w sets another)"
    )
    # The range `nvidia-smi -pl` accepts on this board (nvidia-smi -q -d POWER: Min / Max Power Limit). Used to
    # refuse a gpu.power_limit_w outside it before anything runs; the host role checks the GPU's own range again.
    gpu_power_limit_min_w: float | None = Field(default=None, gt=0, le=MAX_BOARD_POWER_W,
                                                description="lowest settable limit per GPU, W")
    gpu_power_limit_max_w: float | None = Field(default=None, gt=0, le=MAX_BOARD_POWER_W,
                                                description="highest settable limit per GPU, W")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=MAX_GPU_MEMORY_GIB)

    @property
    def sm(self) -> int | None:
        return int(self.compute_capability[2:]) if self.compute_capability else None


RELEASE_PATTERN = r"^\d+\.\d+\.\d+(\.post\d+)?$"


class Upstream(_Strict):
    """Where SGLang itself makes a patch's change: from `release` on the patch is not needed."""

    release: str = Field(pattern=RELEASE_PATTERN, description="the first SGLang release that does it itself")
    link: str


class Patch(_Strict):
    """A change to a file of the installed SGLang, applied by the deploy role with `patch -p1`."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="lower-case letters, digits and '-'")
    target: str = Field(description="file relative to site-packages, e.g. sglang/srt/model_executor/model_runner.py")
    target_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the unpatched file it expects")
    patch: str = Field(description="patch file, relative to the repository root (profiles/patches/...)")
    reason: str
    link: str
    upstream: Upstream | None = None


class Engine(_Strict):
    sglang_version: str | None = Field(default=None, pattern=RELEASE_PATTERN)
    # Unset: the venv's lock follows the pin (profiles/requirements/sglang-X-cpNN.lock, one per container CPython).
    requirements: str | None = Field(
        default=None, description="a set of engine locks other than the release's own, named by one of them, "
        "repo-relative (.../NAME-cp311.lock: its siblings are .../NAME-cp313.lock)")
    venv_path: str = "/opt/sglang/venv"
    patches: list[Patch] = Field(default_factory=list, max_length=MAX_ITEMS)


class ModelConfig(_Strict):
    """Facts of the model's own config.json (Hugging Face), pinned so the parallel layout is checked against the
    model before a GPU host loads it: heads split over tp, experts over ep, layers over pp."""

    num_attention_heads: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="config.json's value")
    num_key_value_heads: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="config.json's value")
    num_hidden_layers: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="config.json's value")
    # DeepSeek-style configs (GLM-5 too) call the routed experts n_routed_experts, Qwen and Mixtral num_experts /
    # num_local_experts: either is taken.
    n_routed_experts: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="config.json's value")
    num_experts: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="config.json's value")

    @property
    def experts(self) -> int | None:
        return self.n_routed_experts or self.num_experts


class ModelSpec(_Strict):
    repo_id: str | None = Field(default=None, pattern=REPO_ID, description="a Hugging Face repo id, org/name")
    revision: str | None = None
    served_model_name: str | None = None
    quantization: str | None = None
    trust_remote_code: bool = False
    local_path: str | None = None
    architecture: str | None = Field(default=None, description="HF architectures[0], e.g. GlmMoeDsaForCausalLM")
    # The checkpoint's size on disk: the model cache's storage is checked against it before anything is
    # downloaded (or even provisioned, by `toolkit host reproduce`).
    size_gib: float | None = Field(default=None, gt=0, description="the checkpoint's size on disk, GiB")
    config: ModelConfig | None = Field(default=None, description="facts from the model's config.json")

    @field_validator("repo_id")
    @classmethod
    def _repo_id_runs(cls, v: str | None) -> str | None:
        if v is not None and ("--" in v or ".." in v):
            raise ValueError("a Hugging Face repo id has no '--' or '..'")
        return v


class Server(_Strict):
    """Typed SGLang knobs. None means: leave SGLang's default, render no flag."""

    # Parallelism
    tp_size: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * MAX_NODES)
    pp_size: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * MAX_NODES)
    ep_size: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * MAX_NODES)
    dp_size: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * MAX_NODES)
    enable_dp_attention: bool = False
    nnodes: int = Field(default=1, ge=1, le=MAX_NODES)
    node_rank: int | None = Field(default=None, ge=0, lt=MAX_NODES)
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
    max_running_requests: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    # SGLang: -1 (or any value <= 0) turns chunked prefill off; a chunk is a count of tokens.
    chunked_prefill_size: int | None = Field(default=None, ge=-1, le=MAX_COUNT)
    num_continuous_decode_steps: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    kv_cache_dtype: str | None = None
    # Graphs and cache
    cuda_graph: bool = True
    cuda_graph_max_bs: int | None = Field(default=None, ge=1, le=MAX_COUNT)
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
    extra_args: list[str] = Field(default_factory=list, max_length=MAX_ITEMS)


# SGLang's router's load-balancing policies (sgl-router / smg `--policy`): cache_aware is its default.
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class Router(_Strict):
    """SGLang's router in front of the replicas: where it listens and how it picks a replica."""

    host: str | None = Field(default=None, pattern=INVENTORY_PATTERN,
                             description="the inventory host it runs on (unset: the first replica's)")
    bind: str = Field(default="127.0.0.1", description="the address it listens on")
    port: int = Field(default=30080, ge=1, le=65535)
    policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = "cache_aware"


class Replicas(_Strict):
    """Data-parallel copies of the whole server, one per host, behind SGLang's router."""

    count: int = Field(ge=1, le=MAX_NODES, description="how many copies of the server")
    # Ansible patterns (hosts or groups), one replica a host in the order they resolve to. Unset: the inventory's
    # gpu_containers (narrowed by --limit).
    hosts: list[Annotated[str, Field(pattern=INVENTORY_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=MAX_ITEMS,
        description="inventory hosts or groups, one replica each (unset: gpu_containers)")
    router: Router = Field(default_factory=Router)
    # A change to a running set goes one replica at a time: each waits for its health before the next stops, the
    # first that fails is put back on its previous unit and the rest are left as they were.
    rolling: bool = Field(default=True, description="change a running set one replica at a time")


class SteadyState(_Strict):
    plateau_fraction: float = Field(default=0.8, gt=0, le=1)
    smooth_s: float = Field(default=2.0, gt=0, le=MAX_PROBE_WINDOW_S)
    min_window_s: float = Field(default=5.0, gt=0, le=MAX_PROBE_WINDOW_S)


class Slo(_Strict):
    """The latency the service is held to, in ms: the 99th percentile over the benchmark's requests (from its
    per-request results, not from means). Any subset; at least one."""

    ttft_p99_ms: float | None = Field(default=None, gt=0, le=MAX_SLO_MS, description="time to first token, p99, ms")
    itl_p99_ms: float | None = Field(default=None, gt=0, le=MAX_SLO_MS,
                                     description="inter-token latency, p99 over all gaps, ms")
    e2e_p99_ms: float | None = Field(default=None, gt=0, le=MAX_SLO_MS,
                                     description="end-to-end request latency, p99, ms")

    @model_validator(mode="after")
    def _one_bound(self) -> Slo:
        if self.ttft_p99_ms is None and self.itl_p99_ms is None and self.e2e_p99_ms is None:
            raise ValueError("an slo needs at least one of ttft_p99_ms, itl_p99_ms, e2e_p99_ms")
        return self


class Bench(_Strict):
    """SGLang's bench_serving run. Defaults are the GLM-5 story's command (docs/story.md, the benchmark)."""

    backend: str = "sglang-oai"
    dataset_name: str = "random"
    random_input_len: int = Field(default=256, ge=1, le=MAX_COUNT)
    random_output_len: int = Field(default=128, ge=1, le=MAX_COUNT)
    random_range_ratio: float | None = Field(default=None, ge=0, le=1)
    num_prompts: int = Field(default=1024, ge=1, le=MAX_COUNT)
    # Requests per second; 0 would send nothing and the run would never end. "inf" sends them all at once.
    request_rate: Annotated[float, Field(gt=0)] | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    concurrency_levels: list[Annotated[int, Field(le=MAX_COUNT)]] = Field(default_factory=list, max_length=MAX_ITEMS)
    warmup_requests: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    seed: int | None = Field(default=None, ge=0, le=MAX_BENCH_SEED)
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
    power_limit_w: float | None = Field(default=None, gt=0, le=MAX_BOARD_POWER_W,
                                        description="enforced power limit per GPU, W")


class Probe(_Strict):
    idle_s: float = Field(default=10, ge=0, le=MAX_PROBE_WINDOW_S)
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

    # Strict like the author's part: `keep_last: yes` would otherwise keep one entry.
    schema_version: int = Field(default=1, strict=True)
    keep_last: int = Field(default=10, ge=1, strict=True)
    entries: list[dict[str, Any]] = Field(default_factory=list)


class Profile(_Strict):
    schema_version: int
    name: str = Field(
        pattern=PROFILE_NAME, max_length=MAX_PROFILE_NAME,
        description="the file's name: lower-case letters, digits, '.', '_', '-'"
    )
    description: str = ""
    extends: str | None = Field(default=None, pattern=PROFILE_NAME, max_length=MAX_PROFILE_NAME,
                                description="the parent profile's name (its file name without .yaml)")
    target: Target = Field(default_factory=Target)
    engine: Engine = Field(default_factory=Engine)
    model: ModelSpec = Field(default_factory=ModelSpec)
    server: Server = Field(default_factory=Server)
    replicas: Replicas | None = None
    env: dict[Annotated[str, Field(pattern=ENV_NAME)], str] = Field(default_factory=dict, max_length=MAX_ITEMS)
    gpu: Gpu = Field(default_factory=Gpu)
    bench: Bench = Field(default_factory=Bench)
    probe: Probe = Field(default_factory=Probe)
    why: dict[str, Why] = Field(default_factory=dict, max_length=MAX_ITEMS)
    # Rules this profile knows it breaks, each with the reason (rule id -> reason), as ansible-lint's skip list:
    # a warning acknowledged here is reported as acknowledged and no longer fails `validate --strict`.
    acknowledge: dict[str, str] = Field(default_factory=dict, max_length=MAX_ITEMS)
    results: ResultsEnvelope | None = None

    @field_validator("acknowledge")
    @classmethod
    def _ack_reasons(cls, v: dict[str, str]) -> dict[str, str]:
        for rule, reason in v.items():
            if not reason.strip():
                raise ValueError(f"acknowledging rule {rule!r} needs a reason: say why the profile breaks it")
        return v

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v > SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is newer than this toolkit understands ({SCHEMA_VERSION})")
        if v < 1:
            raise ValueError("schema_version starts at 1")
        return v
