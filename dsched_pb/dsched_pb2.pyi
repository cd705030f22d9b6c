from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CgroupMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CGROUP_MODE_UNSPECIFIED: _ClassVar[CgroupMode]
    CGROUP_V1: _ClassVar[CgroupMode]
    CGROUP_V2: _ClassVar[CgroupMode]
    CGROUP_NONE: _ClassVar[CgroupMode]

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    DRY_RUN: _ClassVar[Mode]
    ENFORCE: _ClassVar[Mode]
CGROUP_MODE_UNSPECIFIED: CgroupMode
CGROUP_V1: CgroupMode
CGROUP_V2: CgroupMode
CGROUP_NONE: CgroupMode
MODE_UNSPECIFIED: Mode
DRY_RUN: Mode
ENFORCE: Mode

class AgentMessage(_message.Message):
    __slots__ = ("hello", "report", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: NodeReport
    ack: Ack
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[NodeReport, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("directive", "welcome")
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    directive: CapDirective
    welcome: Welcome
    def __init__(self, directive: _Optional[_Union[CapDirective, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "cpu_capacity_cores", "cgroup_mode", "counters_available", "agent_version", "dry_run", "current_caps", "slot_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPACITY_CORES_FIELD_NUMBER: _ClassVar[int]
    CGROUP_MODE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CURRENT_CAPS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cpu_capacity_cores: float
    cgroup_mode: CgroupMode
    counters_available: _containers.RepeatedScalarFieldContainer[str]
    agent_version: str
    dry_run: bool
    current_caps: _containers.RepeatedCompositeFieldContainer[InstanceCap]
    slot_seconds: float
    def __init__(self, node_id: _Optional[str] = ..., cpu_capacity_cores: _Optional[float] = ..., cgroup_mode: _Optional[_Union[CgroupMode, str]] = ..., counters_available: _Optional[_Iterable[str]] = ..., agent_version: _Optional[str] = ..., dry_run: _Optional[bool] = ..., current_caps: _Optional[_Iterable[_Union[InstanceCap, _Mapping]]] = ..., slot_seconds: _Optional[float] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("epoch", "slot_seconds", "mode")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    slot_seconds: float
    mode: Mode
    def __init__(self, epoch: _Optional[int] = ..., slot_seconds: _Optional[float] = ..., mode: _Optional[_Union[Mode, str]] = ...) -> None: ...

class InstanceKey(_message.Message):
    __slots__ = ("app", "operator", "instance")
    APP_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    app: str
    operator: str
    instance: int
    def __init__(self, app: _Optional[str] = ..., operator: _Optional[str] = ..., instance: _Optional[int] = ...) -> None: ...

class InstanceSample(_message.Message):
    __slots__ = ("key", "worker", "stateful", "tids", "pid", "cpu_seconds_total", "cpu_usage_cores", "received_total", "executed_total", "emitted_total", "queue_length", "latency_sum_seconds_total", "latency_count_total", "cap_cores", "throttled_periods_total", "throttled_seconds_total", "periods_total", "service_seconds_total", "upstream", "engine")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STATEFUL_FIELD_NUMBER: _ClassVar[int]
    TIDS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CPU_USAGE_CORES_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SUM_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LATENCY_COUNT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CAP_CORES_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_PERIODS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PERIODS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    key: InstanceKey
    worker: str
    stateful: bool
    tids: _containers.RepeatedScalarFieldContainer[int]
    pid: int
    cpu_seconds_total: float
    cpu_usage_cores: float
    received_total: int
    executed_total: int
    emitted_total: int
    queue_length: int
    latency_sum_seconds_total: float
    latency_count_total: int
    cap_cores: float
    throttled_periods_total: int
    throttled_seconds_total: float
    periods_total: int
    service_seconds_total: float
    upstream: _containers.RepeatedScalarFieldContainer[str]
    engine: str
    def __init__(self, key: _Optional[_Union[InstanceKey, _Mapping]] = ..., worker: _Optional[str] = ..., stateful: _Optional[bool] = ..., tids: _Optional[_Iterable[int]] = ..., pid: _Optional[int] = ..., cpu_seconds_total: _Optional[float] = ..., cpu_usage_cores: _Optional[float] = ..., received_total: _Optional[int] = ..., executed_total: _Optional[int] = ..., emitted_total: _Optional[int] = ..., queue_length: _Optional[int] = ..., latency_sum_seconds_total: _Optional[float] = ..., latency_count_total: _Optional[int] = ..., cap_cores: _Optional[float] = ..., throttled_periods_total: _Optional[int] = ..., throttled_seconds_total: _Optional[float] = ..., periods_total: _Optional[int] = ..., service_seconds_total: _Optional[float] = ..., upstream: _Optional[_Iterable[str]] = ..., engine: _Optional[str] = ...) -> None: ...

class InterfaceBytes(_message.Message):
    __slots__ = ("name", "rx_bytes_total", "tx_bytes_total")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    rx_bytes_total: int
    tx_bytes_total: int
    def __init__(self, name: _Optional[str] = ..., rx_bytes_total: _Optional[int] = ..., tx_bytes_total: _Optional[int] = ...) -> None: ...

class Pressure(_message.Message):
    __slots__ = ("some_avg10", "some_avg60", "full_avg10", "full_avg60")
    SOME_AVG10_FIELD_NUMBER: _ClassVar[int]
    SOME_AVG60_FIELD_NUMBER: _ClassVar[int]
    FULL_AVG10_FIELD_NUMBER: _ClassVar[int]
    FULL_AVG60_FIELD_NUMBER: _ClassVar[int]
    some_avg10: float
    some_avg60: float
    full_avg10: float
    full_avg60: float
    def __init__(self, some_avg10: _Optional[float] = ..., some_avg60: _Optional[float] = ..., full_avg10: _Optional[float] = ..., full_avg60: _Optional[float] = ...) -> None: ...

class NodeSample(_message.Message):
    __slots__ = ("cpu_capacity_cores", "cpu_usage_cores", "cpu_pressure", "interfaces", "llc_occupancy_bytes", "memory_bandwidth_bytes_per_second", "llc_available", "memory_bandwidth_available", "memory_used_bytes", "other_cpu_cores")
    class LlcOccupancyBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MemoryBandwidthBytesPerSecondEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CPU_CAPACITY_CORES_FIELD_NUMBER: _ClassVar[int]
    CPU_USAGE_CORES_FIELD_NUMBER: _ClassVar[int]
    CPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    LLC_OCCUPANCY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LLC_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OTHER_CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    cpu_capacity_cores: float
    cpu_usage_cores: float
    cpu_pressure: Pressure
    interfaces: _containers.RepeatedCompositeFieldContainer[InterfaceBytes]
    llc_occupancy_bytes: _containers.ScalarMap[str, float]
    memory_bandwidth_bytes_per_second: _containers.ScalarMap[str, float]
    llc_available: bool
    memory_bandwidth_available: bool
    memory_used_bytes: float
    other_cpu_cores: float
    def __init__(self, cpu_capacity_cores: _Optional[float] = ..., cpu_usage_cores: _Optional[float] = ..., cpu_pressure: _Optional[_Union[Pressure, _Mapping]] = ..., interfaces: _Optional[_Iterable[_Union[InterfaceBytes, _Mapping]]] = ..., llc_occupancy_bytes: _Optional[_Mapping[str, float]] = ..., memory_bandwidth_bytes_per_second: _Optional[_Mapping[str, float]] = ..., llc_available: _Optional[bool] = ..., memory_bandwidth_available: _Optional[bool] = ..., memory_used_bytes: _Optional[float] = ..., other_cpu_cores: _Optional[float] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("node_id", "slot", "timestamp", "slot_seconds", "instances", "node", "replayed")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    slot: int
    timestamp: float
    slot_seconds: float
    instances: _containers.RepeatedCompositeFieldContainer[InstanceSample]
    node: NodeSample
    replayed: bool
    def __init__(self, node_id: _Optional[str] = ..., slot: _Optional[int] = ..., timestamp: _Optional[float] = ..., slot_seconds: _Optional[float] = ..., instances: _Optional[_Iterable[_Union[InstanceSample, _Mapping]]] = ..., node: _Optional[_Union[NodeSample, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class InstanceCap(_message.Message):
    __slots__ = ("key", "cap_cores")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CAP_CORES_FIELD_NUMBER: _ClassVar[int]
    key: InstanceKey
    cap_cores: float
    def __init__(self, key: _Optional[_Union[InstanceKey, _Mapping]] = ..., cap_cores: _Optional[float] = ...) -> None: ...

class CapDirective(_message.Message):
    __slots__ = ("epoch", "caps", "reason", "release")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    caps: _containers.RepeatedCompositeFieldContainer[InstanceCap]
    reason: str
    release: _containers.RepeatedCompositeFieldContainer[InstanceKey]
    def __init__(self, epoch: _Optional[int] = ..., caps: _Optional[_Iterable[_Union[InstanceCap, _Mapping]]] = ..., reason: _Optional[str] = ..., release: _Optional[_Iterable[_Union[InstanceKey, _Mapping]]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("key", "reason")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key: InstanceKey
    reason: str
    def __init__(self, key: _Optional[_Union[InstanceKey, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("epoch", "applied", "rejected", "stale")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    applied: int
    rejected: _containers.RepeatedCompositeFieldContainer[Rejection]
    stale: bool
    def __init__(self, epoch: _Optional[int] = ..., applied: _Optional[int] = ..., rejected: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., stale: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("node_id", "cpu_capacity_cores", "cgroup_mode", "instances", "last_report_age_seconds", "counters_available", "dry_run")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPACITY_CORES_FIELD_NUMBER: _ClassVar[int]
    CGROUP_MODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cpu_capacity_cores: float
    cgroup_mode: CgroupMode
    instances: int
    last_report_age_seconds: float
    counters_available: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, node_id: _Optional[str] = ..., cpu_capacity_cores: _Optional[float] = ..., cgroup_mode: _Optional[_Union[CgroupMode, str]] = ..., instances: _Optional[int] = ..., last_report_age_seconds: _Optional[float] = ..., counters_available: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("mode", "epoch", "agents", "applications", "instances", "slot_seconds", "version", "uptime_seconds", "engines")
    MODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    APPLICATIONS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    epoch: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentStatus]
    applications: int
    instances: int
    slot_seconds: float
    version: str
    uptime_seconds: float
    engines: _containers.RepeatedCompositeFieldContainer[EngineStatus]
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., epoch: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentStatus, _Mapping]]] = ..., applications: _Optional[int] = ..., instances: _Optional[int] = ..., slot_seconds: _Optional[float] = ..., version: _Optional[str] = ..., uptime_seconds: _Optional[float] = ..., engines: _Optional[_Iterable[_Union[EngineStatus, _Mapping]]] = ...) -> None: ...

class EngineStatus(_message.Message):
    __slots__ = ("name", "kind", "endpoint", "healthy", "reason", "jobs", "instances", "last_read_age_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    LAST_READ_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    endpoint: str
    healthy: bool
    reason: str
    jobs: int
    instances: int
    last_read_age_seconds: float
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., endpoint: _Optional[str] = ..., healthy: _Optional[bool] = ..., reason: _Optional[str] = ..., jobs: _Optional[int] = ..., instances: _Optional[int] = ..., last_read_age_seconds: _Optional[float] = ...) -> None: ...

class SetModeRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ...) -> None: ...

class SetModeReply(_message.Message):
    __slots__ = ("mode", "previous")
    MODE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    previous: Mode
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., previous: _Optional[_Union[Mode, str]] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OperatorPlan(_message.Message):
    __slots__ = ("app", "operator", "instances", "arrival_rate", "predicted_rate", "predictor", "cost_cpu_seconds_per_tuple", "demand_cores", "cap_cores", "usage_cores", "queue_length", "latency_ms", "reason")
    APP_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_RATE_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    COST_CPU_SECONDS_PER_TUPLE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_CORES_FIELD_NUMBER: _ClassVar[int]
    CAP_CORES_FIELD_NUMBER: _ClassVar[int]
    USAGE_CORES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    app: str
    operator: str
    instances: int
    arrival_rate: float
    predicted_rate: float
    predictor: str
    cost_cpu_seconds_per_tuple: float
    demand_cores: float
    cap_cores: float
    usage_cores: float
    queue_length: int
    latency_ms: float
    reason: str
    def __init__(self, app: _Optional[str] = ..., operator: _Optional[str] = ..., instances: _Optional[int] = ..., arrival_rate: _Optional[float] = ..., predicted_rate: _Optional[float] = ..., predictor: _Optional[str] = ..., cost_cpu_seconds_per_tuple: _Optional[float] = ..., demand_cores: _Optional[float] = ..., cap_cores: _Optional[float] = ..., usage_cores: _Optional[float] = ..., queue_length: _Optional[int] = ..., latency_ms: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("epoch", "mode", "timestamp", "operators", "caps", "record_json")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    CAPS_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    mode: Mode
    timestamp: float
    operators: _containers.RepeatedCompositeFieldContainer[OperatorPlan]
    caps: _containers.RepeatedCompositeFieldContainer[InstanceCap]
    record_json: str
    def __init__(self, epoch: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ..., timestamp: _Optional[float] = ..., operators: _Optional[_Iterable[_Union[OperatorPlan, _Mapping]]] = ..., caps: _Optional[_Iterable[_Union[InstanceCap, _Mapping]]] = ..., record_json: _Optional[str] = ...) -> None: ...

class SetQosRequest(_message.Message):
    __slots__ = ("app", "qos_class")
    APP_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    app: str
    qos_class: str
    def __init__(self, app: _Optional[str] = ..., qos_class: _Optional[str] = ...) -> None: ...

class SetQosReply(_message.Message):
    __slots__ = ("app", "qos_class", "app_known")
    APP_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    APP_KNOWN_FIELD_NUMBER: _ClassVar[int]
    app: str
    qos_class: str
    app_known: bool
    def __init__(self, app: _Optional[str] = ..., qos_class: _Optional[str] = ..., app_known: _Optional[bool] = ...) -> None: ...

class ListQosRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QosAssignment(_message.Message):
    __slots__ = ("app", "qos_class", "app_known", "defaulted")
    APP_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    APP_KNOWN_FIELD_NUMBER: _ClassVar[int]
    DEFAULTED_FIELD_NUMBER: _ClassVar[int]
    app: str
    qos_class: str
    app_known: bool
    defaulted: bool
    def __init__(self, app: _Optional[str] = ..., qos_class: _Optional[str] = ..., app_known: _Optional[bool] = ..., defaulted: _Optional[bool] = ...) -> None: ...

class QosClass(_message.Message):
    __slots__ = ("name", "target_latency_ms", "max_violation_ratio", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_VIOLATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    target_latency_ms: float
    max_violation_ratio: float
    weight: float
    def __init__(self, name: _Optional[str] = ..., target_latency_ms: _Optional[float] = ..., max_violation_ratio: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class ListQosReply(_message.Message):
    __slots__ = ("assignments", "classes", "default_class")
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CLASS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[QosAssignment]
    classes: _containers.RepeatedCompositeFieldContainer[QosClass]
    default_class: str
    def __init__(self, assignments: _Optional[_Iterable[_Union[QosAssignment, _Mapping]]] = ..., classes: _Optional[_Iterable[_Union[QosClass, _Mapping]]] = ..., default_class: _Optional[str] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("app", "epochs")
    APP_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    app: str
    epochs: int
    def __init__(self, app: _Optional[str] = ..., epochs: _Optional[int] = ...) -> None: ...

class ExplainReply(_message.Message):
    __slots__ = ("app", "lines", "records_json")
    APP_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_JSON_FIELD_NUMBER: _ClassVar[int]
    app: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    records_json: str
    def __init__(self, app: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., records_json: _Optional[str] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("since_seconds", "max_epochs")
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    since_seconds: float
    max_epochs: int
    def __init__(self, since_seconds: _Optional[float] = ..., max_epochs: _Optional[int] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("report_json",)
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    def __init__(self, report_json: _Optional[str] = ...) -> None: ...
