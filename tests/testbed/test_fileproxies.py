"""HAProxy and nginx as sidecars: their configs (exact text), versions, keys, the file-configured
process against a FakeSystem and a fake /proc, and — as root — both proxies in the one-hop bed
behind Istio-style interception, every mode, with HAProxy's outbound original destination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Mode
from meshtax.testbed.bed import APP_PORTS, PROXY_UID, echo_testbed
from meshtax.testbed.fileproxy import FileProxy, FileProxyError
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.haproxy import HaproxyConfig
from meshtax.testbed.haproxy import parse_version as haproxy_parse
from meshtax.testbed.nginx import NginxConfig
from meshtax.testbed.nginx import parse_version as nginx_parse
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Testbed
from meshtax.testbed.procfs import listening_ports, parse_listening
from meshtax.testbed.proxy import PROXIES, SidecarRequest, family_keys
from meshtax.testbed.runstate import STATE_DIR
from meshtax.testbed.system import Completed, FakeSystem, Placement, RealSystem
from meshtax.testbed.tools import find_tool

# ---- configs ---------------------------------------------------------------------------------


def test_haproxy_config_text() -> None:
    tcp = HaproxyConfig(mode=Mode.TCP, app=("127.0.0.1", 9078)).render(Path("/w"))
    assert tcp == (
        "global\n    nbthread 1\n    maxconn 8192\n"
        "defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 300s\n"
        "    timeout server 300s\n    timeout http-keep-alive 300s\n"
        "frontend inbound\n    bind 0.0.0.0:15006\n    default_backend inbound_app\n"
        "backend inbound_app\n    server app 127.0.0.1:9078\n"
        "frontend outbound\n    bind 0.0.0.0:15001\n    default_backend outbound_dst\n"
        "backend outbound_dst\n    server dst 0.0.0.0\n"
    )
    grpc = HaproxyConfig(mode=Mode.GRPC, app=("127.0.0.1", 9079)).render(Path("/w"))
    assert "mode http" in grpc and "bind 0.0.0.0:15006 proto h2" in grpc
    assert "server app 127.0.0.1:9079 proto h2" in grpc
    assert "mode http" in HaproxyConfig(mode=Mode.HTTP).render(Path("/w"))
    # the original destination inbound too, when no app is given
    assert "server app 0.0.0.0\n" in HaproxyConfig().render(Path("/w"))
    cfg = HaproxyConfig()
    assert cfg.argv(Path("/h"), Path("/w/h.conf"), Path("/w")) == ["/h", "-db", "-f", "/w/h.conf"]
    assert cfg.check_argv(Path("/h"), Path("/c"), Path("/w")) == ["/h", "-c", "-f", "/c"]


def test_nginx_config_text() -> None:
    tcp = NginxConfig(mode=Mode.TCP, app=("127.0.0.1", 9078)).render(Path("/w"))
    assert tcp.startswith("load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n")
    assert "master_process off;" in tcp and "daemon off;" in tcp and "pid /w/nginx.pid;" in tcp
    assert "server { listen 15006; proxy_pass 127.0.0.1:9078; }" in tcp
    # no original destination: the outbound listener has one fixed upstream (none: refused)
    assert "server { listen 15001; proxy_pass 127.0.0.1:1; }" in tcp
    out = NginxConfig(mode=Mode.TCP, outbound_upstream=("10.0.0.9", 80)).render(Path("/w"))
    assert "proxy_pass 10.0.0.9:80;" in out
    http = NginxConfig(mode=Mode.HTTP, app=("127.0.0.1", 9080)).render(Path("/w"))
    assert "load_module" not in http and "access_log off;" in http
    assert "upstream app { server 127.0.0.1:9080; keepalive 64;" in http
    assert "proxy_http_version 1.1;" in http and "client_body_temp_path /w/client_body;" in http
    assert "proxy_request_buffering off; proxy_buffering off;" in http  # streamed, as sidecars
    grpc = NginxConfig(mode=Mode.GRPC, app=("127.0.0.1", 9079)).render(Path("/w"))
    assert "listen 15006 http2;" in grpc and "grpc_pass grpc://app;" in grpc
    argv = NginxConfig().argv(Path("/n"), Path("/w/n.conf"), Path("/w"))
    assert argv == ["/n", "-p", "/w", "-e", "/w/nginx.log", "-c", "/w/n.conf"]
    assert NginxConfig().check_argv(Path("/n"), Path("/c"), Path("/w"))[-2:] == ["-t", "-q"]


def test_versions_and_keys() -> None:
    assert haproxy_parse("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://x\n") == "2.6.12"
    assert nginx_parse("nginx version: nginx/1.22.1\n") == "1.22.1"
    for parse in (haproxy_parse, nginx_parse):
        with pytest.raises(ValueError, match="cannot parse"):
            parse("envoy version: x")
    sysm = FakeSystem(responders=[lambda a: Completed(a, 0, "", "nginx version: nginx/1.22.1\n")])
    assert PROXIES["nginx"].version(sysm, Path("/n")) == "1.22.1"
    # addresses and ports do not shape the work; the mode does, and the proxy
    a = HaproxyConfig(mode=Mode.HTTP, app=("127.0.0.1", 1))
    assert a.key() == HaproxyConfig(mode=Mode.HTTP, app=("10.1.1.1", 9), inbound_port=1).key()
    assert a.key() != HaproxyConfig(mode=Mode.TCP, app=("127.0.0.1", 1)).key()
    assert NginxConfig(app=("a", 1)).key() == NginxConfig(app=("b", 2)).key()
    keys = [family_keys(ProxyChoice(p)) for p in ("envoy", "haproxy", "nginx")]
    assert all(set(k) == {"tcp", "http", "grpc"} for k in keys)
    assert len({k["tcp"] for k in keys}) == 3


def test_kinds_build_file_proxies_and_refuse_unix_sockets(tmp_path: Path) -> None:
    for kind, cls in (("haproxy", HaproxyConfig), ("nginx", NginxConfig)):
        req = SidecarRequest(Mode.HTTP, ("127.0.0.1", 9080), ProxyChoice(kind), tmp_path)
        px = PROXIES[kind].build(FakeSystem(), req)
        assert isinstance(px, FileProxy) and px.config == cls(Mode.HTTP, ("127.0.0.1", 9080))
        uds = SidecarRequest(Mode.TCP, "/s/tcp.sock", ProxyChoice(kind), tmp_path)
        with pytest.raises(ValueError, match="host:port, not a Unix socket"):
            PROXIES[kind].build(FakeSystem(), uds)


# ---- the process -----------------------------------------------------------------------------

TCP_TABLE = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    "   0: 00000000:3A9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337\n"
    "   1: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337\n"
    "   2: 0100007F:2378 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0\n"
)


def test_parse_listening() -> None:
    assert parse_listening(TCP_TABLE) == {15006, 15001}  # the established one is not


def test_file_proxy_checks_places_and_waits_until_it_listens(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    sysm = FakeSystem()
    cfg = HaproxyConfig(app=("127.0.0.1", 9078))
    place = Placement(netns="pod", cpus=(1,), uid=PROXY_UID)
    px = FileProxy(sysm, cfg, tmp_path / "w", place, Path("/h"), proc=proc, start_timeout=0.3)
    with pytest.raises(FileProxyError, match=r"not listening on \[15001, 15006\] after"):
        px.start()  # nothing listens in the fake /proc
    assert sysm.processes[0].returncode is not None  # stopped, not left behind
    (proc / "40002" / "net").mkdir(parents=True)  # the second spawn's PID (FakeSystem counts)
    (proc / "40002" / "net" / "tcp").write_text(TCP_TABLE)
    with FileProxy(sysm, cfg, tmp_path / "w", place, Path("/h"), proc=proc) as px:
        assert px.pid == 40002 and listening_ports(40002, proc) == {15001, 15006}
    assert (tmp_path / "w" / "haproxy.conf").read_text() == cfg.render(tmp_path / "w")
    chown, check = sysm.calls[3], sysm.calls[4]
    assert chown == ("chown", "-R", "1337:1337", str(tmp_path / "w"))
    assert check[-4:] == ("/h", "-c", "-f", str(tmp_path / "w" / "haproxy.conf"))
    assert "--reuid=1337" in check and check[:4] == ("ip", "netns", "exec", "pod")


def test_file_proxy_refused_config_says_why(tmp_path: Path) -> None:
    sysm = FakeSystem(
        responders=[
            lambda a: (
                Completed(a, 1, "", "[ALERT] parsing: unknown keyword 'x'\n") if "-c" in a else None
            )
        ]
    )
    px = FileProxy(sysm, HaproxyConfig(), tmp_path, binary=Path("/h"))
    with pytest.raises(FileProxyError, match="haproxy refused its config: .*unknown keyword"):
        px.start()
    assert not sysm.processes


# ---- real ------------------------------------------------------------------------------------


def _missing(kind: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for name in (kind, "fortio"):
        if find_tool(name) is None:  # type: ignore[arg-type]
            return f"{name} not installed"
    return None


@pytest.mark.root
@pytest.mark.parametrize("kind", ["haproxy", "nginx"])
def test_real_proxy_as_sidecar_every_mode(kind: str) -> None:
    """In the one-hop bed (inbound 8080 → 15006 → the app), every mode answers through the
    proxy; HAProxy also forwards the pod's outbound calls to their original destination."""
    why = _missing(kind)
    if why:
        pytest.skip(why)
    with (
        Testbed(RealSystem(), state_dir=STATE_DIR, lock_timeout=180.0) as tb,
        echo_testbed(tb, Pinning(), proxy=ProxyChoice(kind)) as bed,
    ):
        peer = FortioServer(
            tb.registered,
            bed.workdir / "peer",
            host="0.0.0.0",
            http_port=APP_PORTS[Mode.HTTP],
            grpc_port=APP_PORTS[Mode.GRPC],
            tcp_port=APP_PORTS[Mode.TCP],
            place=bed.client.place(),
        )
        peer.start()
        try:
            for mode in Mode:
                px = bed.start_sidecar(mode)
                try:
                    assert isinstance(px, FileProxy)
                    res = bed.load(bed.meshed_target, mode, 100, n=50)
                    assert res.ok, f"{kind} {mode.value}: {res}"
                    if kind == "haproxy":  # the server pod calls the client pod's echo
                        out = run_load(
                            f"{bed.client.ip}:{APP_PORTS[mode]}",
                            mode,
                            100,
                            0,
                            n=50,
                            system=tb.system,
                            place=bed.server.place(),
                        )
                        assert out.ok, f"outbound {mode.value}: {out}"
                finally:
                    px.stop()
        finally:
            peer.stop()
