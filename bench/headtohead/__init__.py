"""The head-to-head benchmark behind ``bench/compare.py``: bare clickhouse-connect clients, the
clickhouse-lb pool and HAProxy, side by side on one local cluster.

Modules, one job each: :mod:`.haproxy` (config text and the process), :mod:`.contenders`
(what each contender is and how it runs a statement), :mod:`.load` (threads of statements and
their outcomes), :mod:`.scenarios` (what is measured, as data), :mod:`.analysis` (pure
summaries), :mod:`.report` (Markdown), :mod:`.charts` (PNG, matplotlib).
"""
