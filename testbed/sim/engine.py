"""The vectorized cluster: nodes with cores, operator instances with FIFO queues.

Time advances in fixed steps (``scenario.step_seconds``, sub-second). Within a
step every instance has a CPU rate: the smaller of one core (an instance is one
thread), its cap, and -- when a node's busy instances want more than its cores --
a CFS-like max-min fair share (water-filling). A node whose memory-bandwidth use
is high slows the work done per CPU-second by ``1 + slope * (u - threshold)``.

Messages that reach an instance in the same step form a *cohort* (count, CPU
work, sum of birth times, mean arrival time); a cohort's work is the sum of the
messages' gamma-distributed service works, drawn in one piece (a sum of gammas
with one scale is a gamma). Queues are ring buffers of cohorts per instance;
serving is exact FIFO fluid service in time within the step, and operators are
swept in chain order so a message can cross several operators in one step.
When a ring is full the newest cohorts merge (mean latency stays exact, the
spread inside the merged cohort is lost).

Counters are cumulative per instance, like a real agent's: received, executed,
emitted, CPU-seconds, busy (service) seconds, throttled seconds, end-to-end
latency sum and count. Sinks record (app, messages, mean latency) per cohort.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from testbed.sim.arrivals import all_arrivals
from testbed.sim.scenario import Scenario

RING = 32
UNCAPPED = np.inf


@dataclass
class SinkRecords:
    """Finished messages at the sinks, one row per cohort."""

    app: np.ndarray
    count: np.ndarray
    latency_s: np.ndarray
    time_s: np.ndarray


def fair_level(want: np.ndarray, node: np.ndarray, cores: np.ndarray) -> np.ndarray:
    """Per node, the max-min fair level: on an over-committed node every instance
    that wants more than the level gets the level; elsewhere the level is inf."""
    n_nodes = len(cores)
    demand = np.bincount(node, want, minlength=n_nodes)
    over = demand > cores * (1 + 1e-12)
    level = np.full(n_nodes, np.inf)
    if not over.any():
        return level
    m = over[node] & (want > 0)
    level[over] = 0.0
    for _ in range(64):
        sat = m & (want <= level[node])
        sat_sum = np.bincount(node[sat], want[sat], minlength=n_nodes)
        unsat = np.bincount(node[m & ~sat], minlength=n_nodes)
        new = np.where(over & (unsat > 0), (cores - sat_sum) / np.maximum(unsat, 1), level)
        if np.allclose(new[over], level[over], rtol=1e-12, atol=1e-15):
            return new
        level = new
    return level


def waterfill(want: np.ndarray, node: np.ndarray, cores: np.ndarray) -> np.ndarray:
    """Max-min fair CPU per instance: nobody gets more than it wants, and on an
    over-committed node every unsatisfied instance gets the same level."""
    return np.minimum(want, fair_level(want, node, cores)[node])


class ClusterSim:
    """A seeded, vectorized simulation of one scenario's cluster."""

    def __init__(self, scenario: Scenario, max_parallelism: int = 8):
        if max_parallelism < 1:
            raise ValueError(f"max_parallelism must be >= 1, got {max_parallelism}")
        self.sc = scenario
        self.rng = np.random.default_rng(scenario.seed)
        self.dt = scenario.epoch_seconds / scenario.steps_per_epoch
        self.t = 0.0
        self.max_par = P = max_parallelism
        ops = [
            (ai, k, op)
            for ai, app in enumerate(scenario.apps)
            for k, op in enumerate(app.operators)
        ]
        self.n_ops = len(ops)
        self.op_app = np.array([a for a, _, _ in ops], dtype=np.int64)
        self.op_stage = np.array([k for _, k, _ in ops], dtype=np.int64)
        self.op_name = [f"{scenario.apps[a].name}/{o.name}" for a, _, o in ops]
        self.op_work = np.array([o.work_mean_s for _, _, o in ops])
        self.op_cv2 = np.array([o.work_cv**2 for _, _, o in ops])
        self.op_sel = np.array([o.selectivity for _, _, o in ops])
        self.op_stateful = np.array([o.stateful for _, _, o in ops])
        self.op_mbw = np.array([o.mbw_per_core for _, _, o in ops])
        self.cv_values, self.op_cv_group = np.unique(self.op_cv2, return_inverse=True)
        self.pool_cum = [np.zeros(1) for _ in self.cv_values]
        self.pool_pos = [0 for _ in self.cv_values]
        first = np.zeros(len(scenario.apps), dtype=np.int64)
        last = np.zeros(len(scenario.apps), dtype=np.int64)
        for i, (a, k, _) in enumerate(ops):
            if k == 0:
                first[a] = i
            last[a] = i
        self.app_first_op, self.app_last_op = first, last
        self.op_next = np.where(
            np.arange(self.n_ops) == last[self.op_app], -1, np.arange(self.n_ops) + 1
        )
        self.n_stages = int(self.op_stage.max()) + 1
        # Instance slots: op * P + r.
        n = self.n_inst = self.n_ops * P
        self.inst_op = np.repeat(np.arange(self.n_ops), P)
        self.inst_rank = np.tile(np.arange(P), self.n_ops)
        self.inst_stage = self.op_stage[self.inst_op]
        self.stage_slots = [np.flatnonzero(self.inst_stage == s) for s in range(self.n_stages)]
        self.active = np.zeros(n, dtype=bool)
        self.node = np.zeros(n, dtype=np.int64)
        self.cap = np.full(n, UNCAPPED)
        self.paused_until = np.zeros(n)
        # CFS bandwidth control period (the kernel's default cpu.cfs_period_us).
        self.cfs_period_s = 0.1
        # Where each instance's period starts, modulo the period. The kernel runs
        # one period timer per cgroup, and its phase differs from group to group
        # (testbed.sim.calibrate.measure_period_phase); 0 aligns them all.
        self.cfs_phase_s = np.zeros(n)
        # Ticks fall on one grid for every CPU (jiffies); this is where it starts.
        self.cfs_tick_phase_s = 0.0
        self.quota_left = np.full(n, np.inf)
        # With tick enforcement: when an instance whose quota ran out is throttled.
        self.throttle_at = np.full(n, -np.inf)
        # When an instance's queue last ran empty (inf while it has work): a thread
        # that slept is throttled on waking if its quota is spent.
        self.idle_at = np.full(n, -np.inf)
        # NaN: the first step starts a period for everyone, whatever the phase.
        self._period_index = np.full(n, np.nan)
        self.op_k = np.zeros(self.n_ops, dtype=np.int64)
        self.op_rot = np.zeros(self.n_ops, dtype=np.int64)
        # Instances that take new messages (set_dispatch); all of them by default.
        self.dispatch = np.ones(n, dtype=bool)
        self.cores = np.full(scenario.nodes, float(scenario.cores_per_node))
        self.node_slowdown = np.ones(scenario.nodes)
        # Queues.
        # Ring buffers of cohorts, flat: instance i's ring is [i * RING, (i + 1) * RING).
        self.q_count = np.zeros(n * RING, dtype=np.int64)
        self.q_work = np.zeros(n * RING)
        self.q_birth = np.zeros(n * RING)
        self.q_arr = np.zeros(n * RING)
        self.q_start = np.full(n * RING, np.nan)
        self.q_frac = np.zeros(n * RING)  # messages of a partly served cohort, fractional part
        self.head = np.zeros(n, dtype=np.int64)
        self.size = np.zeros(n, dtype=np.int64)
        self.queued = np.zeros(n, dtype=np.int64)
        self.queued_work = np.zeros(n)
        self.work_in_step = np.zeros(n)
        self.work_rate = np.zeros(n)  # smoothed work arriving per second
        # Cumulative counters.
        self.received = np.zeros(n, dtype=np.int64)
        self.executed = np.zeros(n, dtype=np.int64)
        self.emitted = np.zeros(n, dtype=np.int64)
        self.cpu_seconds = np.zeros(n)
        self.busy_seconds = np.zeros(n)
        self.throttled_seconds = np.zeros(n)
        self.latency_sum = np.zeros(n)
        self.latency_count = np.zeros(n, dtype=np.int64)
        self.mbw_seconds = np.zeros(n)  # bandwidth-fraction x seconds
        self.source_arrivals = np.zeros(len(scenario.apps), dtype=np.int64)
        self.created = 0  # messages created by selectivity > 1 (or lost by < 1)
        self.last_alloc = np.zeros(n)
        self.arrival_t, self.arrival_app = all_arrivals(scenario)
        self._next_arrival = 0
        # Operators whose per-message work is given, not drawn: op -> (cumulative work, next).
        self._work_seq: dict[int, list] = {}
        self._sinks: list[tuple[np.ndarray, ...]] = []
        self.reconfigurations = 0

    # ------------------------------------------------------------ layout
    def slots_of(self, op: int) -> np.ndarray:
        return np.arange(op * self.max_par, (op + 1) * self.max_par)

    def set_parallelism(
        self, op: int, k: int, nodes: list[int] | np.ndarray, pause: bool = True
    ) -> None:
        """Run ``k`` instances of ``op``; ``nodes[r]`` places instance r (existing ones keep theirs
        unless told). A change pauses the operator (a rescale restarts it)."""
        if not 1 <= k <= self.max_par:
            raise ValueError(f"parallelism must be in [1, {self.max_par}], got {k}")
        slots = self.slots_of(op)
        changed = k != self.op_k[op]
        for r, node in enumerate(nodes[:k]):
            if not 0 <= int(node) < len(self.cores):
                raise ValueError(f"node must be in [0, {len(self.cores)}), got {node}")
            if not self.active[slots[r]]:
                self.node[slots[r]] = int(node)
        self.active[slots[:k]] = True
        self.active[slots[k:]] = False
        self.op_k[op] = k
        if changed and pause and self.t > 0:
            self.reconfigurations += 1
            self.paused_until[slots[:k]] = self.t + self._pause(op)
        self.inst_rank[slots] = np.arange(self.max_par)

    def move(self, inst: int, node: int) -> None:
        """Migrate one instance: it pauses (longer when stateful) and keeps its queue."""
        if not 0 <= node < len(self.cores):
            raise ValueError(f"node must be in [0, {len(self.cores)}), got {node}")
        if self.node[inst] != node:
            self.node[inst] = node
            self.paused_until[inst] = self.t + self._pause(int(self.inst_op[inst]))
            self.reconfigurations += 1

    def add_node(self, cores: float) -> int:
        """A node joins (testbed.sim.nodepool); its index. ``sc.nodes`` follows, so
        whatever reads the node count from the scenario sees the new node."""
        if not (np.isfinite(cores) and cores > 0):
            raise ValueError(f"cores must be > 0, got {cores!r}")
        self.cores = np.append(self.cores, float(cores))
        self.node_slowdown = np.append(self.node_slowdown, 1.0)
        self.sc = replace(self.sc, nodes=len(self.cores))
        return len(self.cores) - 1

    def remove_last_node(self) -> None:
        """The newest node leaves; it must run no instance (move them first).
        Scaled-in slots that last lived there are re-homed to node 0."""
        last = len(self.cores) - 1
        if last == 0:
            raise ValueError("the last node of a cluster cannot leave")
        if np.any(self.alive & (self.node == last)):
            raise ValueError(f"node {last} still runs instances")
        self.node[self.node == last] = 0
        self.cores = self.cores[:last]
        self.node_slowdown = self.node_slowdown[:last]
        self.sc = replace(self.sc, nodes=last)

    def _pause(self, op: int) -> float:
        return (
            self.sc.stateful_migration_pause_s
            if self.op_stateful[op]
            else self.sc.migration_pause_s
        )

    def set_caps(self, inst: np.ndarray, caps: np.ndarray) -> None:
        """Cap instances in cores; ``inf`` (or 0, like a directive) removes the cap."""
        caps = np.asarray(caps, dtype=float)
        if np.any(~np.isfinite(caps) & ~np.isinf(caps)) or np.any(caps < 0):
            raise ValueError("caps must be >= 0")
        self.cap[inst] = np.where(caps == 0, UNCAPPED, caps)

    def set_arrivals(self, times: np.ndarray, app: np.ndarray) -> None:
        """Replace the scenario's source arrivals (seconds, sorted; app index each),
        e.g. with the ones a live run used. Only before the first step."""
        times = np.asarray(times, dtype=float)
        app = np.asarray(app, dtype=np.int64)
        if self.t > 0:
            raise ValueError("arrivals can only be set before the first step")
        if times.shape != app.shape or times.ndim != 1:
            raise ValueError("arrival times and apps must be 1-D arrays of one length")
        if np.any(np.diff(times) < 0) or np.any(times < 0):
            raise ValueError("arrival times must be sorted and >= 0")
        if np.any((app < 0) | (app >= len(self.sc.apps))):
            raise ValueError(f"arrival app must be in [0, {len(self.sc.apps)})")
        self.arrival_t, self.arrival_app = times, app
        self._next_arrival = 0

    def set_work_sequence(self, op: int, work_s: np.ndarray) -> None:
        """Give ``op``'s messages this CPU work (seconds at one core), in the order they
        reach the operator, instead of gamma draws: a live run's exact work."""
        work_s = np.asarray(work_s, dtype=float)
        if not 0 <= op < self.n_ops:
            raise ValueError(f"op must be in [0, {self.n_ops}), got {op}")
        if work_s.ndim != 1 or np.any(work_s < 0) or not np.all(np.isfinite(work_s)):
            raise ValueError("work_s must be a 1-D array of finite values >= 0")
        self._work_seq[op] = [np.concatenate([[0.0], np.cumsum(work_s)]), 0]

    def set_period_phase(self, inst: np.ndarray, phase_s: np.ndarray) -> None:
        """Start the CFS periods of ``inst`` at ``phase_s`` (seconds, modulo the period)."""
        phase_s = np.asarray(phase_s, dtype=float)
        if np.any(~np.isfinite(phase_s)):
            raise ValueError("phase_s must be finite")
        self.cfs_phase_s[inst] = np.mod(phase_s, self.cfs_period_s)

    def set_tick_phase(self, phase_s: float) -> None:
        """Put the scheduler ticks at ``phase_s`` + k * ``scenario.cfs_tick_s``."""
        if not np.isfinite(phase_s):
            raise ValueError("phase_s must be finite")
        tick = self.sc.cfs_tick_s
        self.cfs_tick_phase_s = float(np.mod(phase_s, tick)) if tick > 0 else 0.0

    def _on_tick(self, t: np.ndarray) -> np.ndarray:
        """The first tick at or after ``t`` (``t`` itself when enforcement is exact)."""
        tick = self.sc.cfs_tick_s
        if tick <= 0:
            return t
        ph = self.cfs_tick_phase_s
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(t), np.ceil((t - ph) / tick - 1e-9) * tick + ph, t)

    @property
    def alive(self) -> np.ndarray:
        """Instances that run: active ones and scaled-in ones still draining their queue."""
        return self.active | (self.size > 0)

    # ------------------------------------------------------------ one step
    def step(self) -> None:
        sc, dt = self.sc, self.dt
        t0, t1 = self.t, self.t + dt
        # Source arrivals of this step, per application.
        j = int(np.searchsorted(self.arrival_t, t1, side="left"))
        a_idx = self.arrival_app[self._next_arrival : j]
        a_t = self.arrival_t[self._next_arrival : j]
        self._next_arrival = j
        n_apps = len(sc.apps)
        in_count = np.zeros(self.n_ops, dtype=np.int64)
        in_tsum = np.zeros(self.n_ops)
        in_birth = np.zeros(self.n_ops)
        if len(a_idx):
            c = np.bincount(a_idx, minlength=n_apps)
            s = np.bincount(a_idx, a_t, minlength=n_apps)
            self.source_arrivals += c
            in_count[self.app_first_op] += c
            in_tsum[self.app_first_op] += s + c * sc.handoff_s
            in_birth[self.app_first_op] += s
        # CPU: who wants it, who gets it.
        alive = self.alive
        op_busy = np.bincount(self.inst_op, self.size > 0, minlength=self.n_ops) > 0
        feeding = np.zeros(self.n_ops, dtype=bool)
        has_next = self.op_next >= 0
        feeding[self.op_next[has_next]] = op_busy[has_next] | (in_count[has_next] > 0)
        busy = (self.size > 0) | ((in_count > 0) | feeding)[self.inst_op]
        running = alive & busy & (self.paused_until <= t0)
        # CFS bandwidth control: a capped thread runs at full speed until its
        # quota (cap x period) is spent, then waits for the next period.
        period = self.cfs_period_s
        index = np.floor((t0 - self.cfs_phase_s) / period + 1e-9)
        refill = (index != self._period_index) | (dt >= period)
        if refill.any():
            self._period_index = index
            quota = np.where(np.isfinite(self.cap), self.cap * max(period, dt), np.inf)
            if sc.cfs_tick_s > 0:
                # What a thread overran its last quota by comes out of this one.
                quota = quota + np.minimum(self.quota_left, 0.0)
            self.quota_left = np.where(refill, quota, self.quota_left)
            self.throttle_at = np.where(refill, -np.inf, self.throttle_at)
        # CPU the quota still allows: what is left, or, for a thread whose quota ran
        # out between ticks, the time until the tick that throttles it.
        allowance = np.where(
            self.quota_left > 1e-12,
            self.quota_left,
            np.maximum(self.throttle_at - t0, 0.0),
        )
        limit = np.where(running & (allowance > 1e-12), 1.0, 0.0)
        # What a thread can use this step: its backlog plus what usually arrives,
        # and no more than its quota. Under contention CFS gives each runnable
        # thread up to the fair level; an idle thread takes nothing.
        need = np.minimum(np.minimum(limit, allowance / dt), self.queued_work / dt + self.work_rate)
        level = fair_level(need, self.node, self.cores)
        alloc = np.minimum(limit, level[self.node])
        slow = self.node_slowdown[self.node]
        rate = alloc / slow
        busy_time = np.zeros(self.n_inst)
        cpu_left = self.quota_left.copy()
        for stage in range(self.n_stages):
            slots = self.stage_slots[stage]
            ops_here = np.flatnonzero((self.op_stage == stage) & (in_count > 0))
            if len(ops_here):
                self._enqueue(ops_here, in_count, in_tsum, in_birth)
            in_count, in_tsum, in_birth = self._serve(
                slots, rate, alloc, cpu_left, t0, t1, busy_time
            )
        used = alloc * busy_time
        self.quota_left = cpu_left
        self.cpu_seconds += used
        self.busy_seconds += busy_time
        # Throttled: work waiting while the quota is spent.
        spent = np.isfinite(self.cap) & (cpu_left <= 1e-12) & (self.size > 0)
        # Busy time can exceed the step by a rounding error; a counter must not go down.
        self.throttled_seconds += np.where(spent, np.maximum(dt - busy_time, 0.0), 0.0)
        mbw = used * self.op_mbw[self.inst_op]
        self.mbw_seconds += mbw
        util = np.bincount(self.node, mbw, minlength=len(self.cores)) / (dt * self.cores)
        self.node_slowdown = 1.0 + sc.interference_slope * np.maximum(
            0.0, util - sc.interference_threshold
        )
        self.last_alloc = np.where(busy_time > 0, alloc, 0.0)
        self.work_rate = 0.8 * self.work_rate + 0.2 * self.work_in_step / dt
        self.work_in_step[:] = 0.0
        self.t = t1

    def _enqueue(self, ops: np.ndarray, in_count, in_tsum, in_birth) -> None:
        P = self.max_par
        k = self.op_k[ops]
        if np.any(k == 0):
            raise RuntimeError(f"operator {self.op_name[int(ops[k == 0][0])]} has no instance")
        n_op = in_count[ops]
        r = np.arange(P)[None, :]
        live = r < k[:, None]
        ok = live & self.dispatch[ops[:, None] * P + r]
        # An operator whose every instance is marked off still has to take its messages.
        ok = np.where(ok.any(axis=1)[:, None], ok, live)
        m = ok.sum(axis=1)
        rank = np.cumsum(ok, axis=1) - 1
        share = n_op[:, None] // m[:, None] + (
            ((rank - self.op_rot[ops][:, None]) % m[:, None]) < (n_op % m)[:, None]
        )
        share = np.where(ok, share, 0)
        self.op_rot[ops] = (self.op_rot[ops] + n_op) % np.maximum(m, 1)
        inst = (ops[:, None] * P + r)[share > 0]
        n = share[share > 0]
        op = self.inst_op[inst]
        frac = n / in_count[op]
        birth = in_birth[op] * frac
        arr = in_tsum[op] / in_count[op]
        work = self._work(op, n)
        full = self.size[inst] >= RING
        pos = inst * RING + (self.head[inst] + np.where(full, RING - 1, self.size[inst])) % RING
        fresh = ~full
        self.q_count[pos] = np.where(fresh, 0, self.q_count[pos]) + n
        self.q_work[pos] = np.where(fresh, 0.0, self.q_work[pos]) + work
        self.q_birth[pos] = np.where(fresh, 0.0, self.q_birth[pos]) + birth
        self.q_arr[pos] = np.where(fresh, arr, self.q_arr[pos])
        self.q_start[pos] = np.where(fresh, np.nan, self.q_start[pos])
        self.q_frac[pos] = np.where(fresh, 0.0, self.q_frac[pos])
        self.size[inst] += fresh
        self.queued[inst] += n
        self.queued_work[inst] += work
        self.work_in_step[inst] += work
        self.received[inst] += n

    def set_dispatch(self, takes: np.ndarray) -> None:
        """Which instances take new messages (one bool per slot): a round robin that
        skips some instances, e.g. those on nodes a policy marks over-utilised.
        Queued messages stay where they are."""
        takes = np.asarray(takes, dtype=bool)
        if takes.shape != (self.n_inst,):
            raise ValueError(f"takes must hold one bool per instance slot ({self.n_inst})")
        self.dispatch = takes.copy()

    def sample_message_work(self, op: np.ndarray) -> np.ndarray:
        """CPU work (seconds at one core) of one message of each operator in ``op``,
        drawn as the simulation draws it."""
        op = np.asarray(op, dtype=np.int64)
        return self._work(op, np.ones(len(op), dtype=np.int64))

    def _work(self, op: np.ndarray, n: np.ndarray) -> np.ndarray:
        """CPU work of cohorts of ``n`` messages: sums of n iid gamma draws, taken as
        differences of a running sum over a pool of unit draws (one pool per CV)."""
        work = n * self.op_work[op]
        group = self.op_cv_group[op]
        for g in np.unique(group) if len(self.cv_values) > 1 else (0,):
            sel = group == g if len(self.cv_values) > 1 else slice(None)
            cv2 = self.cv_values[g]
            if cv2 == 0:
                continue
            ns = n[sel]
            total = int(ns.sum())
            if self.pool_pos[g] + total >= len(self.pool_cum[g]):
                draws = self.rng.standard_gamma(1.0 / cv2, size=max(1 << 20, 2 * total)) * cv2
                self.pool_cum[g] = np.concatenate([[0.0], np.cumsum(draws)])
                self.pool_pos[g] = 0
            ends = self.pool_pos[g] + np.cumsum(ns)
            starts = ends - ns
            cum = self.pool_cum[g]
            work[sel] = (cum[ends] - cum[starts]) * self.op_work[op[sel]]
            self.pool_pos[g] = int(ends[-1]) if len(ends) else self.pool_pos[g]
        if self._work_seq:
            for i in np.flatnonzero(np.isin(op, list(self._work_seq))):
                cum, pos = self._work_seq[int(op[i])]
                end = pos + int(n[i])
                if end >= len(cum):
                    raise RuntimeError(
                        f"operator {self.op_name[int(op[i])]}: work sequence of "
                        f"{len(cum) - 1} messages exhausted"
                    )
                work[i] = cum[end] - cum[pos]
                self._work_seq[int(op[i])][1] = end
        return work

    def _serve(self, slots, rate, alloc, cpu_left, t0: float, t1: float, busy_time: np.ndarray):
        local = np.full(len(slots), t0)
        nxt = (np.zeros(self.n_ops, dtype=np.int64), np.zeros(self.n_ops), np.zeros(self.n_ops))
        while True:
            ok = (
                (self.size[slots] > 0)
                & (rate[slots] > 0)
                & (local < t1 - 1e-12)
                & ((cpu_left[slots] > 1e-12) | (local < self.throttle_at[slots] - 1e-12))
            )
            if not ok.any():
                break
            where = np.flatnonzero(ok)
            inst = slots[where]
            h = inst * RING + self.head[inst]
            begin = np.maximum(local[where], self.q_arr[h])
            r = rate[inst]
            need = self.q_work[h] / r
            finish = begin + need
            # The quota may run out before the step ends; the thread is throttled
            # then, or on the next tick with tick enforcement. A thread that went
            # idle after its quota ran out is throttled when it wakes up (the
            # kernel checks the quota on enqueue), not on the tick.
            has_quota = cpu_left[inst] > 1e-12
            with np.errstate(divide="ignore", invalid="ignore"):
                exhausted = begin + cpu_left[inst] / alloc[inst]
            woke = (begin > local[where] + 1e-12) | (self.idle_at[inst] < begin - 1e-12)
            throttle = np.where(
                has_quota,
                self._on_tick(exhausted),
                np.where(woke, np.minimum(begin, self.throttle_at[inst]), self.throttle_at[inst]),
            )
            self.throttle_at[inst] = np.where(
                (has_quota & (finish > exhausted)) | (~has_quota & woke),
                throttle,
                self.throttle_at[inst],
            )
            stop = np.minimum(t1, np.maximum(throttle, begin))
            done = finish <= stop
            start = self.q_start[h]
            start = np.where(np.isnan(start), begin, start)
            part = ~done
            if part.any():
                # A cohort served only partly: its messages finish one by one, so
                # the served share of its work finishes the same share of them.
                ip, hp = inst[part], h[part]
                ran = np.maximum(stop[part] - begin[part], 0.0)
                served = r[part] * ran
                cpu_left[ip] -= alloc[ip] * ran
                n = self.q_count[hp]
                # Progress accumulates across steps: a slow instance finishes a
                # message of a large cohort after several steps, not never.
                progress = self.q_frac[hp] + n * served / self.q_work[hp]
                m = np.minimum(np.floor(progress).astype(np.int64), n - 1)
                self.q_frac[hp] = np.where(m < n - 1, progress - m, 0.0)
                self.q_work[hp] -= served
                self.queued_work[ip] -= served
                busy_time[ip] += ran
                local[where[part]] = t1
                self.idle_at[ip] = np.inf
                self.q_start[hp] = np.where(m > 0, t1, start[part])
                if m.any():
                    k = m > 0
                    birth = self.q_birth[hp[k]] * m[k] / n[k]
                    self.q_birth[hp[k]] -= birth
                    self.q_count[hp[k]] -= m[k]
                    mid = (start[part][k] + t1) / 2.0
                    self._finish(ip[k], m[k], birth, mid, t1, nxt)
            if done.any():
                i_d, h_d = inst[done], h[done]
                busy_time[i_d] += need[done]
                cpu_left[i_d] -= alloc[i_d] * need[done]
                local[where[done]] = finish[done]
                n = self.q_count[h_d]
                birth = self.q_birth[h_d]
                s, e = start[done], finish[done]
                mean_done = s + (e - s) * (n + 1) / (2.0 * n)
                self.queued_work[i_d] = np.maximum(0.0, self.queued_work[i_d] - self.q_work[h_d])
                self.head[i_d] = (self.head[i_d] + 1) % RING
                self.size[i_d] -= 1
                self.idle_at[i_d] = np.where(self.size[i_d] == 0, finish[done], np.inf)
                self._finish(i_d, n, birth, mean_done, t1, nxt)
        return nxt

    def _finish(self, inst, n, birth, mean_done, t1: float, nxt) -> None:
        """``n`` messages of each of ``inst`` finished around ``mean_done``: count them
        and pass them on (or record them at the sink)."""
        self.latency_sum[inst] += n * mean_done - birth
        self.latency_count[inst] += n
        self.executed[inst] += n
        self.queued[inst] -= n
        op = self.inst_op[inst]
        sel = self.op_sel[op]
        out_n = np.where(sel == 1.0, n, self.rng.poisson(n * sel))
        self.created += int(out_n.sum() - n.sum())
        self.emitted[inst] += out_n
        nxt_op = self.op_next[op]
        to_next = nxt_op >= 0
        if to_next.any():
            dest = nxt_op[to_next]
            on = out_n[to_next]
            nxt[0][:] += np.bincount(dest, on, minlength=self.n_ops).astype(np.int64)
            nxt[1][:] += np.bincount(
                dest, on * (mean_done[to_next] + self.sc.handoff_s), minlength=self.n_ops
            )
            nxt[2][:] += np.bincount(dest, on * birth[to_next] / n[to_next], minlength=self.n_ops)
        sink = ~to_next
        if sink.any():
            self._sinks.append(
                (
                    self.op_app[op[sink]],
                    n[sink],
                    mean_done[sink] - birth[sink] / n[sink],
                    np.full(int(sink.sum()), t1),
                )
            )

    # ------------------------------------------------------------ results
    def run_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def take_sinks(self) -> SinkRecords:
        """Finished cohorts since the last call."""
        if not self._sinks:
            e = np.empty(0)
            return SinkRecords(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), e, e)
        parts = list(zip(*self._sinks, strict=True))
        self._sinks = []
        return SinkRecords(*(np.concatenate(p) for p in parts))

    def in_system(self) -> int:
        """Messages waiting or in service anywhere."""
        return int(self.queued.sum())
