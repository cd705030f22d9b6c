"""``mips``: two-stage instance placement by Monte Carlo tree search as
published in "MIPS: Instance Placement for Stream Processing Systems based on
Monte Carlo Tree Search" (Huang et al., §II–§III).

Each application is a request with a fixed number of containers of equal
capacity (:mod:`controller.placement.heron` derives them from the cluster
unless ``containers_per_app`` and ``container_cores`` say). Stage 1 maps its
instances to containers minimising objective (8), ``alpha`` times the
cross-container traffic share plus ``1 - alpha`` times the share of
containers used; stage 2 maps the used containers to nodes minimising (9),
traffic times hops between the nodes in ``topology`` (``flat``: one hop
between any two nodes; ``fat-tree``; ``jellyfish``). Both stages are
searched by :mod:`controller.placement.mcts` with ``samples_per_decision``
samples per decision, actions over any unmapped item and the paper's
expansion, best-child prior and simulation refinements.

Options the controller's configuration has always passed keep working:
``samples`` is ``samples_per_decision``; ``container_weight`` w, the weight
of containers against traffic, is ``alpha = 1 / (1 + w)`` when ``alpha`` is
not given; ``node_weight`` weighs the nodes used in stage 2 (0: the paper's
objective, hops only).
"""

from __future__ import annotations

from controller.placement.baselines import _check_number
from controller.placement.heron import TwoStageStrategy
from controller.placement.twostage import MctsOptions, mips_csmp, mips_icmp

DEFAULT_SAMPLES_PER_DECISION = 64


def _samples(samples_per_decision: object, samples: object) -> int:
    if samples_per_decision is not None and samples is not None and samples != samples_per_decision:
        raise ValueError(
            f"samples ({samples!r}) and samples_per_decision ({samples_per_decision!r}) "
            "name the same budget; give one"
        )
    value = samples_per_decision if samples_per_decision is not None else samples
    if value is None:
        return DEFAULT_SAMPLES_PER_DECISION
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"samples_per_decision must be an int >= 1, got {value!r}")
    return value


class MipsStrategy(TwoStageStrategy):
    """MIPS/MIPS: MCTS for instances -> containers and containers -> nodes."""

    name = "mips"
    stage_names = ("MCTS", "MCTS")

    def __init__(
        self,
        samples_per_decision: int | None = None,
        seed: int = 0,
        exploration: float = 0.3,
        epsilon: float = 0.0,
        alpha: float | None = None,
        container_cores: float | None = None,
        containers_per_app: int | None = None,
        topology: str = "flat",
        topology_seed: int = 0,
        prior: bool = True,
        expansion: bool = True,
        samples: int | None = None,
        container_weight: float | None = None,
        node_weight: float = 0.0,
    ) -> None:
        super().__init__(container_cores, containers_per_app, topology, topology_seed, seed)
        self.samples_per_decision = _samples(samples_per_decision, samples)
        self.exploration = _check_number("exploration", exploration, 0.0)
        self.epsilon = _check_number("epsilon", epsilon, 0.0, 1.0)
        if alpha is not None and container_weight is not None:
            raise ValueError("give alpha or container_weight (alpha = 1 / (1 + w)), not both")
        if alpha is None:
            w = 1.0 if container_weight is None else container_weight
            w = _check_number("container_weight", w, 0.0)
            alpha = 1.0 / (1.0 + w)
        self.alpha = _check_number("alpha", alpha, 0.0, 1.0)
        self.node_weight = _check_number("node_weight", node_weight, 0.0)
        for name, flag in (("prior", prior), ("expansion", expansion)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        self.options = MctsOptions(
            samples_per_decision=self.samples_per_decision,
            exploration=self.exploration,
            epsilon=self.epsilon,
            prior=prior,
            expansion=expansion,
        )
        self.samples_used = 0

    @property
    def samples(self) -> int:
        """The configuration's name for :attr:`samples_per_decision`."""
        return self.samples_per_decision

    def stages(self):
        self._stats: dict[str, int] = {}
        return (
            mips_icmp(self.alpha, self.options, self._stats),
            mips_csmp(self.options, self.node_weight, self._stats),
        )

    def fresh(self, state, headroom_cores):
        groups, reasons = super().fresh(state, headroom_cores)
        self.samples_used = self._stats.get("samples", 0)
        reasons.append(
            f"MCTS with {self.samples_per_decision} samples per decision "
            f"({self.samples_used} in all, seed {self.seed}, alpha {self.alpha:.3g}, "
            f"{self.topology} network)"
        )
        return groups, reasons


__all__ = ["DEFAULT_SAMPLES_PER_DECISION", "MipsStrategy"]
