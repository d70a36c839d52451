"""Polls NVIDIA UFM's REST API for the fabric (aggregator.sources.ufm parses what it returns).

Why a poller of its own: UFM is a server outside the cluster that can be slow, restarting, behind
a certificate the cluster does not trust, or answering an error page. None of that may cost the
cluster its HyperNodes. So each poll either yields a whole new parsed snapshot or changes nothing:
on a refused connection, a timeout, a 401/403 (credentials), a 5xx or a body that is not the
documented JSON, the last good facts stay in use, the source is marked stale in metrics
(`hypertopo_source_stale{source="ufm"}` = 1, `hypertopo_source_last_success_timestamp_seconds`,
`hypertopo_source_errors_total{kind}`), and the log says so once, then again only after 2, 4, 8, ...
failures in a row (or when the kind of failure changes), and once when UFM answers again.

Credentials come from files, as a Kubernetes Secret mounted as a volume gives them (no Secret read
through the API, so no RBAC): a directory holding `username` and `password`, or `token` (an access
token, sent on UFM's token path `/ufmRestV3` as `Authorization: Basic <token>`, as UFM documents).
The files are read on every poll, so a rotated Secret is picked up without a restart. TLS
certificates are verified (against `ca_bundle` when given, else the system's store) unless
`verify=False` is asked for explicitly.

The port listing is asked for with UFM's active filter (`ports?active=true`: Active, Armed and
Initialize ports, as NVIDIA's own UFM plugins ask for it), which leaves out the many switch ports
never cabled; `--ufm-all-ports` asks for the whole listing, and so does the poller by itself once a
UFM answers the filter with 400 or 404.

Only the standard library talks HTTP here (urllib, ssl): no runtime dependency is added.
"""

from __future__ import annotations

import argparse
import base64
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from agent.common.command_line import one_line
from aggregator.graph import FabricGraph
from aggregator.sources import Cluster, OptionError, Source, Worker, ufm, ufm_graph
from aggregator.sources.ibnetdiscover import HostNames

log = logging.getLogger(__name__)

SOURCE = "ufm"
MAX_BODY = 512 << 20  # a 10,000-host fabric's port listing is tens of MiB; refuse runaway bodies
OPTIONAL = ("links", "systems", "unhealthy_ports")
PATHS = {"ports": ufm.PORTS_PATH, "links": ufm.LINKS_PATH, "systems": ufm.SYSTEMS_PATH,
         "unhealthy_ports": ufm.UNHEALTHY_PATH}  # fmt: skip


class UfmFetchError(Exception):
    """One failed poll: `kind` is unreachable | timeout | auth | http | malformed | credentials | empty
    (no ports where there were some: a UFM still discovering is not a fabric without cables)."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""
    token: str = ""

    def header(self) -> str | None:
        if self.token:
            return f"Basic {self.token}"  # UFM's token scheme (/ufmRestV3)
        if self.username:
            pair = f"{self.username}:{self.password}".encode()
            return "Basic " + base64.b64encode(pair).decode("ascii")
        return None


def read_credentials(directory: str | None) -> Credentials:
    """`token`, else `username` + `password`, from a mounted Secret's directory (None: none)."""
    if not directory:
        return Credentials()
    root = Path(directory)

    def read(name: str) -> str:
        try:
            return (root / name).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise UfmFetchError("credentials", f"cannot read {root / name}: {exc}") from exc

    token = read("token")
    if token:
        return Credentials(token=token)
    username, password = read("username"), read("password")
    if not username or not password:
        raise UfmFetchError("credentials", f"{root}: expected files `username` and `password`, or `token`")
    return Credentials(username=username, password=password)


@dataclass(frozen=True)
class UfmConfig:
    url: str  # https://ufm.example.com (a bare host means https)
    credentials_dir: str | None = None
    interval: float = 300.0
    timeout: float = 30.0
    ca_bundle: str | None = None
    verify: bool = True
    all_ports: bool = False  # ask for the whole port listing, not only the active ports

    @property
    def base(self) -> str:
        url = self.url.rstrip("/")
        return url if url.startswith(("http://", "https://")) else f"https://{url}"


class UfmClient:
    """One poll: the port listing (required; the active ports only, `ports?active=true`, unless
    `all_ports`), then links, systems and unhealthy ports (each skipped for good once UFM answers 404
    for it). A UFM that answers the active filter with 400 or 404 is asked for the whole port
    listing from then on (said once in the log)."""

    def __init__(self, config: UfmConfig) -> None:
        self.config = config
        self._context = self._tls(config)
        self._missing: set[str] = set()  # optional listings this UFM answered 404 for
        self.active_only = not config.all_ports  # False once UFM refused the active filter

    @staticmethod
    def _tls(config: UfmConfig) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=config.ca_bundle)
        if not config.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def fetch(self) -> ufm.UfmFabric:
        credentials = read_credentials(self.config.credentials_dir)
        bodies = {"ports": self._ports(credentials)}  # sets active_only to what was asked for
        for name in OPTIONAL:
            if name in self._missing:
                continue
            try:
                bodies[name] = self._get(name, credentials)
            except UfmFetchError as exc:
                if exc.status != 404:
                    raise
                self._missing.add(name)
                log.info("UFM has no %s listing (404): reading cabling from the ports only", name)
        try:
            return ufm.from_bodies(bodies, active_only=self.active_only)  # decoded and parsed in the pure module
        except ufm.UfmDecodeError as exc:
            raise UfmFetchError("malformed", f"GET {self.url_of(exc.listing, credentials)}: {exc.reason}") from exc
        except ufm.UfmError as exc:
            raise UfmFetchError("malformed", f"UFM answered JSON that is not its documented shape: {exc}") from exc

    def _ports(self, credentials: Credentials) -> bytes:
        """The port listing: the active ports, or the whole listing from a UFM without the filter."""
        if not self.active_only:
            return self._get("ports", credentials)
        try:
            return self._get("ports", credentials, query=ufm.ACTIVE_FILTER)
        except UfmFetchError as exc:
            if exc.status not in (400, 404):
                raise
            refused = str(exc)
        body = self._get("ports", credentials)  # failing too (a UFM starting up): the filter is tried again next poll
        self.active_only = False
        log.info("UFM refused the active-ports filter (%s): asking for the whole port listing from now on", refused)
        return body

    def url_of(self, name: str, credentials: Credentials, query: str = "") -> str:
        prefix = "/ufmRestV3" if credentials.token else "/ufmRest"
        return f"{self.config.base}{prefix}{PATHS[name]}" + (f"?{query}" if query else "")

    def _get(self, name: str, credentials: Credentials, *, query: str = "") -> bytes:
        url = self.url_of(name, credentials, query)
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        header = credentials.header()
        if header:
            request.add_header("Authorization", header)
        https = url.startswith("https://")
        try:
            with urllib.request.urlopen(
                request, timeout=self.config.timeout, context=self._context if https else None
            ) as response:
                body = response.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            raise self._http_error(url, exc) from exc
        except TimeoutError as exc:
            raise UfmFetchError("timeout", f"GET {url}: no answer within {self.config.timeout:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise UfmFetchError("timeout", f"GET {url}: no answer within {self.config.timeout:g}s") from exc
            raise UfmFetchError("unreachable", f"GET {url}: {exc.reason}") from exc
        except (OSError, ValueError) as exc:  # reset connections, bad status lines, truncated chunks
            raise UfmFetchError("unreachable", f"GET {url}: {exc}") from exc
        if len(body) > MAX_BODY:
            raise UfmFetchError("malformed", f"GET {url}: response larger than {MAX_BODY >> 20} MiB")
        return body

    @staticmethod
    def _http_error(url: str, exc: urllib.error.HTTPError) -> UfmFetchError:
        status = exc.code
        if status in (401, 403):
            what = "credentials refused" if status == 401 else "access denied for this user"
            return UfmFetchError("auth", f"GET {url}: {status} {what}: check the UFM Secret", status)
        return UfmFetchError("http", f"GET {url}: HTTP {status} {exc.reason}", status)


class SourceMetrics:
    """Per-source staleness gauges, registered once per registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        kwargs: dict[str, Any] = {"registry": registry}
        self.stale = Gauge("hypertopo_source_stale", "1 while a polled fabric source serves its last good facts "
                           "(its latest poll failed, or none succeeded yet)", ["source"], **kwargs)  # fmt: skip
        self.last_success = Gauge("hypertopo_source_last_success_timestamp_seconds",
                                  "When a polled fabric source last answered usefully (Unix time)", ["source"], **kwargs)  # fmt: skip
        self.errors = Counter("hypertopo_source_errors_total", "Failed polls of a fabric source, by kind",
                              ["source", "kind"], **kwargs)  # fmt: skip


class UfmPoller:
    """Keeps the last good UFM snapshot, polling every `interval` seconds on a thread of its own."""

    def __init__(
        self,
        client: UfmClient,
        *,
        interval: float,
        registry: CollectorRegistry | None = None,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.interval = interval
        self.on_change = on_change
        self.clock = clock
        self.metrics = SourceMetrics(registry)
        self.metrics.stale.labels(source=SOURCE).set(1)
        self.facts: ufm.UfmFabric | None = None  # the last good snapshot
        self.generation = 0  # bumped on every change of the facts
        self.failures = 0  # in a row
        self.failing_since: float | None = None
        self.last_success: float | None = None
        self.last_error = ""
        self._last_kind = ""
        self.dead = False  # the polling loop ended without being asked to
        self.polls = 0  # polls done, failed or not
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def bind(self, registry: CollectorRegistry | None, on_change: Callable[[], None]) -> None:
        """Registers the metrics in the controller's registry; `on_change` wakes its reconcile."""
        self.metrics = SourceMetrics(registry)
        self.metrics.stale.labels(source=SOURCE).set(0 if self.last_success is not None and not self.failures else 1)
        if self.last_success is not None:
            self.metrics.last_success.labels(source=SOURCE).set(self.last_success)
        self.on_change = on_change

    def stale_reason(self) -> str | None:
        """None while the last poll succeeded; else what failed since when, and which facts are used."""
        if self.failures == 0:
            return None
        since = time.strftime("%H:%M:%S", time.gmtime(self.failing_since or 0))
        using = (f"using the facts of {time.strftime('%H:%M:%S', time.gmtime(self.last_success))}"
                 if self.last_success is not None else "no facts from UFM yet: not reconciling until it answers")  # fmt: skip
        return f"{self.last_error} (failing since {since} UTC, {self.failures} polls); {using}"

    def snapshot(self) -> tuple[int, ufm.UfmFabric | None]:
        with self._lock:
            return self.generation, self.facts

    def poll_once(self) -> bool:
        """One poll; True when UFM answered usefully. Never raises: whatever UFM answers, however
        the reading of it fails (a parser's surprise included), it is one failed poll (counted,
        stale, logged with back-off) and the last good facts stay; the poller thread lives on."""
        try:
            return self._poll()
        finally:
            self.polls += 1

    def _poll(self) -> bool:
        try:
            fresh = self.client.fetch()
            if not fresh.ports and self.facts is not None and self.facts.ports:
                raise UfmFetchError("empty", "UFM lists no ports at all (still discovering after a restart?)")
            self._succeeded(fresh)
        except UfmFetchError as exc:
            self._failed(exc)
            return False
        except Exception as exc:  # an answer no reader foresaw: a failed poll, not a dead thread
            self._failed(UfmFetchError("malformed", f"UFM's answer could not be read: {type(exc).__name__}: "
                                       f"{one_line(str(exc), width=200)}"))  # fmt: skip
            return False
        return True

    def _succeeded(self, fresh: ufm.UfmFabric) -> None:
        merged = ufm.remember(self.facts, fresh)  # outside the lock: a failure here changes nothing
        with self._lock:
            changed = self.facts is None or _differs(self.facts, merged)
            self.facts = merged
            if changed:
                self.generation += 1
        if self.failures:
            log.info("UFM answers again after %d failed poll(s): %s", self.failures, ufm.summary(merged))
        elif changed:
            log.info("UFM fabric: %s", ufm.summary(merged))
        for warning in fresh.warnings if changed else ():
            log.warning("UFM: %s", warning)
        self.failures, self._last_kind, self.failing_since = 0, "", None
        self.last_success = self.clock()
        self.metrics.stale.labels(source=SOURCE).set(0)
        self.metrics.last_success.labels(source=SOURCE).set(self.last_success)
        if changed:
            self.on_change()

    def _failed(self, exc: UfmFetchError) -> None:
        self.failures += 1
        self.last_error = f"{exc.kind}: {exc}"
        if self.failing_since is None:
            self.failing_since = self.clock()
        self.metrics.stale.labels(source=SOURCE).set(1)
        self.metrics.errors.labels(source=SOURCE, kind=exc.kind).inc()
        first = exc.kind != self._last_kind
        if first or self.failures & (self.failures - 1) == 0:  # once, then at 2, 4, 8, ... in a row
            keeping = "keeping the last good fabric facts" if self.facts is not None else "no fabric facts from UFM yet"
            log.warning("UFM poll failed (%s, %d in a row): %s; %s", exc.kind, self.failures, exc, keeping)
        self._last_kind = exc.kind

    # -- the thread ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Polls until `stop` is set. Should the loop ever end otherwise, the source says so: stale
        in metrics, not ready (`/readyz`), and one error in the log."""
        try:
            while not stop.is_set():
                self.poll_once()
                stop.wait(self.interval)
        finally:
            if not stop.is_set():
                self.dead = True
                self.metrics.stale.labels(source=SOURCE).set(1)
                log.error("UFM poller stopped unexpectedly: no more polls until the aggregator restarts")

    def start(self) -> UfmPoller:
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name="ufm-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.config.timeout + 5)


def _differs(old: ufm.UfmFabric, new: ufm.UfmFabric) -> bool:
    return old.ports != new.ports or old.links != new.links or old.systems != new.systems or old.unhealthy != new.unhealthy


# --- the source (aggregator.registry.SOURCES) ------------------------------------------------------


class UfmSource(Source):
    """UFM's REST API as a live fabric source of `hypertopo-aggregator run` (see the module doc), or
    its listings saved to files (`--ufm-json`, for `render` too: read once, never stale).

    Until UFM has answered once there are no facts to build on, and a tree built without them
    would drop every HyperNode UFM's cabling gave (spines, cores): `ready()` is False until then,
    and the controller neither reconciles nor reports ready (/readyz) meanwhile. After that an
    outage keeps the last good facts."""

    name = SOURCE

    def __init__(
        self, poller: UfmPoller | None, host_names: HostNames | None = None, facts: ufm.UfmFabric | None = None
    ) -> None:
        self.poller = poller  # None: listings saved to a file (--ufm-json), read once
        self.host_names = host_names or HostNames()
        self._generation = 0
        self._facts = facts

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        add = parser.add_argument
        add("--ufm-json", metavar="PATH", help="UFM's REST listings saved as JSON: one file {\"ports\": [...], "
            "\"links\": [...], \"systems\": [...]} or a directory of ports.json, links.json, systems.json")  # fmt: skip
        if not live:
            return  # `render` reads files only
        add("--ufm-url", metavar="URL", help="NVIDIA UFM to poll for the fabric (https://HOST; REST listings "
            "ports, links, systems): switch cabling, HCA ports, port state as node health")  # fmt: skip
        add("--ufm-credentials", metavar="DIR", help="directory of the mounted UFM Secret: files `username` and "
            "`password`, or `token` (an access token); read on every poll")  # fmt: skip
        add("--ufm-interval", type=float, default=60.0, metavar="SECONDS",
            help="seconds between UFM polls (default 60)")  # fmt: skip
        add("--ufm-timeout", type=float, default=30.0, metavar="SECONDS",
            help="seconds to wait for each UFM answer (default 30)")  # fmt: skip
        add("--ufm-ca-bundle", metavar="FILE", help="CA certificates (PEM) that UFM's TLS certificate is "
            "verified against (default: the system's)")  # fmt: skip
        add("--ufm-insecure-skip-tls-verify", action="store_true",
            help="do not verify UFM's TLS certificate (testing only)")  # fmt: skip
        add("--ufm-all-ports", action="store_true", help="ask UFM for its whole port listing, every switch "
            "port cabled or not (default: the active ports only, ports?active=true; a UFM that refuses "
            "the filter with 400/404 gets the whole listing asked for anyway)")  # fmt: skip

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> UfmSource | None:
        url, saved = getattr(options, "ufm_url", None), getattr(options, "ufm_json", None)
        if url and saved:
            raise OptionError("--ufm-url and --ufm-json: give one of them")
        if saved:
            return cls(None, ufm_host_names(options), facts=ufm.load_file(saved))
        if not live or not url:
            return None
        if options.ufm_interval <= 0 or options.ufm_timeout <= 0:
            raise OptionError("--ufm-interval and --ufm-timeout must be positive")
        if options.ufm_insecure_skip_tls_verify:
            log.warning("UFM: TLS certificate verification is off (--ufm-insecure-skip-tls-verify)")
        config = UfmConfig(
            url=url,
            credentials_dir=options.ufm_credentials,
            interval=options.ufm_interval,
            timeout=options.ufm_timeout,
            ca_bundle=options.ufm_ca_bundle,
            verify=not options.ufm_insecure_skip_tls_verify,
            all_ports=options.ufm_all_ports,
        )
        try:
            client = UfmClient(config)
        except (OSError, ssl.SSLError) as exc:  # an unreadable CA bundle
            raise OptionError(f"--ufm-ca-bundle {options.ufm_ca_bundle}: {exc}") from exc
        return cls(UfmPoller(client, interval=config.interval), ufm_host_names(options))

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        if self._facts is None:
            return
        warnings = ufm_graph.apply(graph, self._facts, self.host_names)
        graph.warnings.extend(f"{self.name}: {w}" for w in warnings)
        if cluster.include_fabric_hosts:  # render without a cluster: the hosts UFM names are the nodes
            for host in graph.fabric_hosts():
                graph.add_node(host)

    def refresh(self, now: float) -> bool:
        if self.poller is None:
            return False
        generation, facts = self.poller.snapshot()
        if generation == self._generation:
            return False
        self._generation, self._facts = generation, facts
        return True

    def ready(self) -> bool:
        """True once UFM has answered once (there are facts to build on), while its poller runs."""
        return self.poller is None or (self.poller.snapshot()[1] is not None and not self.poller.dead)

    def stale(self) -> str | None:
        return None if self.poller is None else self.poller.stale_reason()

    def workers(self, *, registry: Any = None, wake: Callable[[], None] = lambda: None) -> Sequence[Worker]:
        if self.poller is None:
            return ()
        self.poller.bind(registry, wake)
        return [("ufm-poller", self.poller.run)]


def ufm_host_names(options: argparse.Namespace) -> HostNames:
    """`--strip-domain` (and `--dump-host-regex` for node descriptions), as for dump hosts."""
    from aggregator.sources.ibnetdiscover import host_names_from

    return host_names_from(options)
