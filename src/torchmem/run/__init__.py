"""``torchmem run``, the zero-config run: a layer of its own, above capture/report/actions/integrations and
below cli (which only parses the command line).

launcher (the capture's name, one session around the program, signals, ``--nproc``), program (the program
run as ``python`` runs it), summary (the end-of-run text), session (:class:`~torchmem.run.session.Session`:
the lifecycle, composing the parts) and its parts: records, status, sampler, timeline, steps, watchers,
overhead, followers, rank_state, ooms, modules, verdicts, advice.
"""
