"""The local lab: what the demo, the tests and the benches use to run actonce on this machine.

Not part of the installed package (production pools are started by an operator, compose or
systemd): it runs from the checkout, like `demo/` and `bench/`. One module per noun:
`redis` (find or start a Redis), `postgres` (a fresh database), `processes` (starting, ending and
measuring subprocesses), `pool` (workers and a dispatcher as subprocesses), `flower`, `settle`
(wait until a workspace's runs have finished) and `census` (count artifactr's log by id).
"""
