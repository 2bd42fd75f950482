"""The projection layer in the papers' applications (``polyproj bench apps``).

Three end-to-end trainings, each run for several methods and seeds on data available offline:

- :mod:`polyproj.apps.portfolio` — portfolio weights from a sequence model on skfolio's bundled S&P 500
  prices, through a layer onto the paper's polytope or a capped simplex; loss: negative Sharpe;
- :mod:`polyproj.apps.matching` — partial graph matching of synthetic keypoint sets, the score matrix
  projected onto ``{X >= 0, X1 <= 1, Xᵀ1 <= 1, ΣX <= α}``;
- :mod:`polyproj.apps.mhc` — manifold-constrained hyper-connections on sklearn's digits, the residual
  mixing matrices projected onto the Birkhoff polytope.

The orchestration (:mod:`~polyproj.apps.runner`: a fresh process per training run, the table, the JSON,
the plots) and the records (:mod:`~polyproj.apps.records`) import no torch; the applications and the
peers (:mod:`~polyproj.apps.peers`) are torch programs on top of :mod:`polyproj.adapters.torch` and
are imported only when a run starts. The results and how to reproduce them: README.md, "Applications".
"""
