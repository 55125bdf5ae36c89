"""One client of the launched node graph: ``heisd-bench graph``, ``sim-graph`` and ``soak``.

- :mod:`.processes`: start, supervise and stop the graph's node processes on a private DDS
  domain (their logs, their deaths named).
- :mod:`.listener`: one listener of the graph's topics that records every arrival with its
  time (commands, HybridSteps, diagnostics, and on request cameras, robot state, episodes).
- :mod:`.phases`: one method's graph phase, for the bench (this process plays the robot's
  inputs) and for the sim graph (the sim node plays them); :mod:`.inprocess`: the same
  decoder in this process; :mod:`.replay`: the observations the bench plays.
- :mod:`.figures`, :mod:`.report`, :mod:`.sim_report`: the figures (pure) and the Markdown.
- :mod:`.bench_cli`, :mod:`.sim_cli`: the options and the run of each subcommand.
- :mod:`.soak` (``heisd-bench soak``): the sim graph for long, in windows;
  :mod:`.soak_procs`: its /proc samples and log scan; :mod:`.soak_report`: its figures per
  window, verdict, Markdown and figure.
"""
