"""A proxy the user brings: the template filled in (exact text), its command line, its key,
what the choice refuses; and, as root, HAProxy brought as if it were the user's, answering in
every mode through the one-hop bed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Mode
from meshtax.testbed.bed import echo_testbed
from meshtax.testbed.custom import TemplateConfig, custom_version
from meshtax.testbed.fileproxy import FileProxy
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Testbed
from meshtax.testbed.proxy import PROXIES, SidecarRequest
from meshtax.testbed.runstate import STATE_DIR
from meshtax.testbed.system import Completed, FakeSystem, RealSystem
from meshtax.testbed.tools import find_tool

#: HAProxy's sidecar config as a user would write it for meshtax (tests and docs use it)
HAPROXY_TEMPLATE = """\
global
    nbthread 1
defaults
    mode ${mode}
    timeout connect 1s
    timeout client 300s
    timeout server 300s
frontend inbound
    bind 0.0.0.0:${inbound_port}
    default_backend app
backend app
    server app ${app_host}:${app_port}
"""


def test_template_filled_in_and_its_command_line() -> None:
    cfg = TemplateConfig(
        "listen ${inbound_port} ${outbound_port}; to ${app_host}:${app_port} as $mode; "
        "pid ${workdir}/p; keep $server_addr",
        args="${binary} --conf=${config} -d",
        mode=Mode.HTTP,
        app=("127.0.0.1", 9080),
    )
    text = cfg.render(Path("/w"))
    assert text == "listen 15006 15001; to 127.0.0.1:9080 as http; pid /w/p; keep $server_addr"
    assert cfg.ports() == (15006, 15001)
    assert cfg.argv(Path("/my proxy"), Path("/w/proxy.conf"), Path("/w")) == [
        "/my proxy",
        "--conf=/w/proxy.conf",
        "-d",
    ]
    plain = TemplateConfig("listen ${inbound_port}")
    assert plain.ports() == (15006,)  # no outbound listener asked for: not waited for
    assert plain.argv(Path("/b"), Path("/c"), Path("/w")) == ["/b", "-c", "/c"]
    assert plain.check_argv(Path("/b"), Path("/c"), Path("/w")) == ["true"]
    with pytest.raises(ValueError, match="never says"):
        TemplateConfig("listen 80")


def test_keys_follow_the_config_and_mode_not_the_addresses() -> None:
    a = TemplateConfig("l ${inbound_port} ${app_port}", app=("127.0.0.1", 1))
    assert a.key() == TemplateConfig("l ${inbound_port} ${app_port}", app=("10.0.0.1", 9)).key()
    assert a.key() != TemplateConfig("l ${inbound_port} ${app_port} x").key()
    assert a.key() != TemplateConfig("l ${inbound_port} ${app_port}", mode=Mode.HTTP).key()
    assert a.key() != TemplateConfig("l ${inbound_port} ${app_port}", args="${binary}").key()


def test_choice_of_a_proxy_you_bring() -> None:
    c = ProxyChoice("custom", binary="/opt/l2p", template="x ${inbound_port}", name="l2p")
    assert c.label == "custom:l2p" and c.describe() == "custom:l2p"
    assert ProxyChoice.from_dict(c.to_dict()) == c
    with pytest.raises(ProxyError, match="needs its binary and a config template"):
        ProxyChoice("custom", binary="/opt/l2p")
    with pytest.raises(ProxyError, match="meshtax's to configure"):
        ProxyChoice("envoy", template="x")
    req = SidecarRequest(Mode.TCP, ("127.0.0.1", 9078), c, Path("/w"), binary=Path("/opt/l2p"))
    px = PROXIES["custom"].build(FakeSystem(), req)
    assert isinstance(px, FileProxy) and px.binary == Path("/opt/l2p")
    assert PROXIES["custom"].binary(c) == Path("/opt/l2p")


def test_version_is_the_first_line_it_prints() -> None:
    def answer(argv: tuple[str, ...]) -> Completed | None:
        return Completed(argv, 0, "\nl2p 2.1.0 (abc)\nmore\n", "")

    assert custom_version(FakeSystem(responders=[answer]), Path("/b")) == "l2p 2.1.0 (abc)"
    failing = FakeSystem(responders=[lambda argv: Completed(argv, 1, "", "no such flag")])
    assert custom_version(failing, Path("/b")) == "unknown"


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or find_tool("haproxy") is None or find_tool("fortio") is None,
    reason="needs root, HAProxy and fortio",
)
def test_real_brought_proxy_answers_every_mode() -> None:
    """HAProxy brought as a user's binary with a template, in tcp mode (HAProxy says tcp or
    http, so this template fixes it): it carries every protocol to the app."""
    binary = find_tool("haproxy")
    assert binary is not None
    c = ProxyChoice(
        "custom",
        binary=binary,
        template=HAPROXY_TEMPLATE.replace("${mode}", "tcp"),
        args="${binary} -db -f ${config}",
        name="haproxy-as-yours",
    )
    with (
        Testbed(RealSystem(), state_dir=STATE_DIR, lock_timeout=180.0) as tb,
        echo_testbed(tb, Pinning(), proxy=c) as bed,
    ):
        for app in Mode:
            px = bed.start_sidecar(Mode.TCP, name=f"tcp-{app.value}", app=app)
            try:
                assert isinstance(px, FileProxy) and px.binary == Path(binary)
                res = bed.load(bed.meshed_target, app, 100, n=50)
                assert res.ok, f"{app.value}: {res}"
            finally:
                px.stop()
