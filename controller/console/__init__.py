"""The operator's console: an HTTP view of the cluster, its prices, plans and jobs,
served by ``oasisd`` itself on ``[web] listen`` (:mod:`.settings`).

Parts: :mod:`.settings` (the ``[web]`` table and its exposure rule), :mod:`.sessions`
(a token becomes a session cookie), :mod:`.data` (what each page shows, read from the
same controller views as the gRPC API), :mod:`.heatmap` (server x slot binning),
:mod:`.pages` (the HTML shells), :mod:`.app` (the aiohttp application and its routes,
with its parts :mod:`.login`, :mod:`.middleware`, :mod:`.views`, :mod:`.streams`,
:mod:`.connections` and :mod:`.state`).
The JavaScript and CSS in ``static/`` are written here and ship in the package: nothing is
fetched from the network.

Importing this package loads nothing heavy; the daemon imports :mod:`.app` only when the
console is on.
"""
