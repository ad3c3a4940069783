"""The program planner: a layout for every array of a JAX function, chosen by cost.

One pipeline, a module per stage, in the order a plan is made:

1. **trace** — :mod:`.rules` says what each JAX primitive does to layouts (a registry:
   elementwise, layout map, dot, call to inline, scan, opaque); :mod:`.walk` is the one
   interpreter over jaxprs; :mod:`.graph` reads a traced function into a frozen
   :class:`~.graph.Graph` of arrays (:class:`~.nodes.Value`) and steps
   (:class:`~.nodes.Step`).
2. **problem** — :mod:`.steps` costs each step kind in one place (time, bytes, collectives
   for given layouts), from the resharding costs of :mod:`.moves`; :mod:`.pricing` fills the
   solver's matrices from it, a frozen :class:`~.problem.Problem`.
3. **search** — :mod:`.search` finds the cheapest choices (:mod:`.fold` solves identical
   parts, the layers of a stack, once; :mod:`.eliminate` folds chains and trees exactly, and
   what cycles leave where its tables stay small; an integer program solves the rest;
   :mod:`.local` improves a plan one array at a time);
   :mod:`.baselines` and :mod:`.baseline_plans` make the named baselines, :mod:`.top` the
   runners-up, these from the min-marginals of :mod:`.marginals` where dynamic programming
   solved the problem; :mod:`.within` keeps plans within a memory budget; a large problem's
   baselines are solved in threads beside the search (:mod:`.beside`).
4. **solution** — :mod:`.solution` reads a solution back as layouts and its prediction;
   :mod:`.memory` counts the bytes held per device at each program point; :mod:`.overlap`
   replays the plan with collectives beside compute (GPUs, TPUs).
5. **explain** — :mod:`.explain` attributes every collective and every second to the step
   that causes it (from the same step costs); :mod:`.report` reads a plan op by op.
6. **run** — :mod:`.apply` runs the program under a plan's layouts; :mod:`.verify` compiles
   and times it and checks the prediction against the compiled HLO.

:mod:`.program` ties the stages into :func:`~.program.plan`, whose result is a
:class:`~.plans.ProgramPlan` (:mod:`.plans`: run, place, verify, report), and says each stage
as it starts to whoever listens (:mod:`.stages`: the command's status line); :mod:`.models`
holds the built-in models and :mod:`.sweep` the what-if across batch sizes.
"""
