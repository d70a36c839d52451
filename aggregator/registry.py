"""The list of fabric sources: the one place a new source is added (see aggregator.sources).

Why a module of its own: the list drives the `render` and `run` options, loading from them, the
graph build and the live controller, and a live source's poller is an adapter (HTTP), which the
pure modules (aggregator.sources, aggregator.pipeline) may not import. So the list lives here,
beside the command line, and the pure pipeline receives the loaded sources as plain objects.

The order is the graph-build order: a source's `apply` sees the facts of those before it (dumps
and UFM match their hosts against the nodes and the GUIDs the reports carry; label levels come
last, above every switch level).
"""

from __future__ import annotations

import argparse

from aggregator.adapters.ufm import UfmSource
from aggregator.sources import OptionError, Source, SourceError
from aggregator.sources.ibnetdiscover import Dumps
from aggregator.sources.labels import LabelLevels
from aggregator.sources.measured import MeasuredFabric
from aggregator.sources.model import ModelFile
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchTables

SOURCES: tuple[type[Source], ...] = (
    NodeReports,
    ModelFile,
    Dumps,
    UfmSource,
    SwitchTables,
    LabelLevels,
    MeasuredFabric,  # last: its leaf groups are for the nodes no source before it placed
)


def add_source_arguments(parser: argparse.ArgumentParser, *, live: bool) -> None:
    """Every source's options, the same names and help for `render` (live False) and `run`."""
    for kind in SOURCES:
        kind.add_arguments(parser, live=live)


def load_sources(options: argparse.Namespace, *, live: bool) -> tuple[Source, ...]:
    """The sources the options ask for, in graph-build order. Raises the sources' own errors
    as SourceError (file and line for unusable files), OptionError for a bad option value."""
    loaded = []
    for kind in SOURCES:
        try:
            source = kind.load(options, live=live)
        except OptionError:
            raise
        except (ValueError, OSError) as exc:  # each source's own error, naming its file and line
            raise SourceError(str(exc)) from exc
        if source is not None:
            loaded.append(source)
    return tuple(loaded)
