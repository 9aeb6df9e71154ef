"""``nodehealth preflight``: one srun step that checks a whole allocation and names the bad node.

``ranks`` reads who this task is (SLURM_PROCID & co.), ``local`` gathers this node's facts (the
prolog-phase checks, the paths, the versions, the NCCL self-test), ``exchange`` is the protocol
over the shared directory (one report file per rank, a ring of peer reads, a barrier with a
deadline, rank 0's one listing), ``judge`` turns the reports into named findings (pure),
``hygiene`` is rank 0's bounded Slurm reads (time limit, drained nodes, output files). See
docs/preflight.md.
"""
