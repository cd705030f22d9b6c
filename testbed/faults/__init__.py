"""The fault matrix's machinery (`dsched bench faults`, docs/reliability.md).

``netlab``: network namespaces joined by veth pairs to a bridge, links that go
down and up; ``daemons``: the real controller and agents (each agent in its own
namespace); ``audit``: what the cgroup tree holds while faults happen;
``fuzz``: seeded bad input for reports, directives, the registration socket and
config files; ``threads``: threads that exit and pids that are reused between a
decision and its write.
"""
