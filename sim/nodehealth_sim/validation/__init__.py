"""The validation kit's replay (docs/validation.md): the half that needs the simulator.

``nodehealth validate-nvml`` records a node's NVML answers (``nodehealth.validation``, read-only, part of
the product). Here, from that record: ``scenario_writer`` writes the node as a scenario, ``replay`` runs
that scenario through the simulator and completes the report with ``compare``'s differences.
``nodehealth-sim replay DIR`` does it for a directory recorded on a node without the simulator.
"""
