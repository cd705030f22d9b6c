"""Simulated clusters driven by the unmodified controller (docs/simulation.md).

* :mod:`testbed.sim.scenario` -- validated scenario data and the named builders
  (``seed004``, ``seed004_paper``, ``wordcount``, ``scale``);
* :mod:`testbed.sim.arrivals` -- Poisson, Weibull and trace arrivals with bursts;
* :mod:`testbed.sim.engine` -- the vectorized cluster (nodes, cores, instances,
  FIFO queues, CFS-like sharing, caps, interference, migration pauses);
* :mod:`testbed.sim.des` -- an exact discrete-event FCFS queue for validation;
* :mod:`testbed.sim.agents` -- simulated agents: NodeReports out, CapDirectives in;
* :mod:`testbed.sim.policies` -- dsched (through the controller) and the baselines;
* :mod:`testbed.sim.run` -- one policy over one scenario, summarised per QoS class;
* :mod:`testbed.sim.measure` -- C² of a warm-up's inter-arrival gaps and service
  times, for the controller's latency model;
* :mod:`testbed.sim.calibrate` -- one chain live (real threads under real CFS
  quotas, :mod:`testbed.sim.calworker`) and simulated with the same inputs, and
  the measurements of the live effects the simulation models.
"""
