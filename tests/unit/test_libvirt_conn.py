"""LibvirtConnection against libvirt's real test driver (test:///default, in-process, no daemon)."""

from __future__ import annotations

import sys
import uuid

import pytest
import tenacity
from test_audit import client_records

from vgpuvirt.errors import InvalidSpec, LibvirtError, MissingDependency
from vgpuvirt.libvirt_bound import VIR_ERR_OPERATION_TIMEOUT, retry_transient
from vgpuvirt.libvirt_conn import VIR_ERR_NO_DOMAIN, LibvirtConnection, no_retry

libvirt = pytest.importorskip("libvirt")


def _xml(name: str, *, mdev: str | None = None, disk: str | None = None) -> str:
    dev = ""
    if mdev:
        dev += (f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
                f"<address uuid='{mdev}'/></source></hostdev>")
    if disk:
        dev += f"<disk type='file' device='disk'><source file='{disk}'/><target dev='vda' bus='virtio'/></disk>"
    return (f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
            f"<os><type>hvm</type></os><devices>{dev}</devices></domain>")


@pytest.fixture
def conn():
    c = LibvirtConnection("test:///default", retry=no_retry)
    made: list[str] = []
    c.made = made  # type: ignore[attr-defined]
    yield c
    for name in made:
        c.destroy(name)
        c.undefine(name)
    c.close()


def _name() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def test_define_start_destroy_undefine_cycle(conn):
    name = _name()
    conn.made.append(name)
    mdev = str(uuid.uuid4())
    assert conn.define(_xml(name, mdev=mdev)) == name
    assert conn.exists(name)
    assert not conn.is_active(name)
    conn.start(name)
    assert conn.is_active(name)
    conn.start(name)  # already running: converges, no error
    info = {d.name: d for d in conn.domains()}[name]
    assert info.active and info.persistent and mdev in info.xml
    assert (name, info.xml) in list(conn.domain_xml_pairs())
    assert conn.destroy(name) is True
    assert conn.destroy(name) is False
    assert conn.undefine(name) == []
    assert not conn.exists(name)
    assert conn.undefine(name) == []  # gone: no-op


def test_undefine_keeps_disks_by_default(conn, tmp_path):
    disk = tmp_path / "disk.qcow2"
    disk.write_bytes(b"data")
    name = _name()
    conn.made.append(name)
    conn.define(_xml(name, disk=str(disk)))
    conn.undefine(name)
    assert disk.exists()


def test_bad_xml_is_translated_with_domain_and_code(conn):
    name = _name()
    bad = _xml(name).replace("<devices>", "<devices><hostdev mode='subsystem' type='mdev' model='bogus'>"
                                          "<source><address uuid='" + str(uuid.uuid4()) + "'/></source></hostdev>")
    with pytest.raises(LibvirtError) as ei:
        conn.define(bad)
    assert ei.value.domain == name
    assert ei.value.code not in (None, 0)
    assert ei.value.uri == "test:///default"
    assert not conn.exists(name)


def test_missing_domain_errors_carry_name_and_code(conn):
    with pytest.raises(LibvirtError) as ei:
        conn.start("no-such-domain-x")
    assert ei.value.code == VIR_ERR_NO_DOMAIN
    assert "no-such-domain-x" in str(ei.value)


def test_refuses_bad_names_and_xml_before_libvirt(conn):
    with pytest.raises(InvalidSpec):
        conn.start("bad;name")
    with pytest.raises(InvalidSpec):
        conn.define("<domain><name>x")
    with pytest.raises(InvalidSpec):
        LibvirtConnection("")


def test_hotplug_is_refused_clearly_on_the_test_driver(conn):
    assert conn.driver == "test"
    assert conn.supports_hotplug is False
    name = _name()
    conn.made.append(name)
    conn.define(_xml(name))
    with pytest.raises(LibvirtError) as ei:
        conn.attach(name, "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
                          f"<address uuid='{uuid.uuid4()}'/></source></hostdev>")
    assert ei.value.domain == name


def _lv_error(code: int) -> Exception:
    exc = libvirt.libvirtError("synthetic")
    exc.err = (code, 10, f"synthetic error {code}", 2, None, None, None, 0, 0)
    return exc


class _Flaky:
    """A libvirt call that fails with a transient error ``failures`` times, then answers "ok"; ``calls`` counts."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise _lv_error(VIR_ERR_OPERATION_TIMEOUT)
        return "ok"


def test_transient_errors_are_retried_and_others_are_not():
    policy = retry_transient(attempts=3, max_wait=0)
    c = LibvirtConnection("test:///default", retry=policy)
    flaky = _Flaky(2)
    assert c._call("d1", "start", flaky) == "ok"
    assert flaky.calls == 3

    calls = {"n": 0}

    def broken() -> str:
        calls["n"] += 1
        raise _lv_error(1)

    with pytest.raises(LibvirtError) as ei:
        c._call("d1", "start", broken)
    assert calls["n"] == 1 and ei.value.code == 1 and ei.value.domain == "d1"


def test_transient_retry_gives_up_after_the_policy():
    c = LibvirtConnection("test:///default",
                          retry=retry_transient(attempts=2, max_wait=0))
    calls = {"n": 0}

    def always() -> None:
        calls["n"] += 1
        raise _lv_error(VIR_ERR_OPERATION_TIMEOUT)

    with pytest.raises(LibvirtError) as ei:
        c._call("d", "start", always)
    assert calls["n"] == 2 and ei.value.code == VIR_ERR_OPERATION_TIMEOUT
    assert isinstance(no_retry(), tenacity.Retrying)


def test_missing_libvirt_python_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "libvirt", None)
    c = LibvirtConnection("test:///default")
    with pytest.raises(MissingDependency) as ei:
        c.domains()
    assert "vgpuvirt[libvirt]" in str(ei.value)


class _CodelessFailure:
    """A domain whose flagged undefine fails with no libvirt error set (seen on the test driver)."""

    def __init__(self, real, plain_fails: bool) -> None:
        self.real, self.plain_fails, self.calls = real, plain_fails, []

    def undefineFlags(self, flags: int) -> int:
        self.calls.append("undefineFlags")
        exc = libvirt.libvirtError("virDomainUndefineFlags() failed")
        exc.err = None   # what libvirt-python holds when virGetLastError() had nothing
        raise exc

    def undefine(self) -> int:
        self.calls.append("undefine")
        if self.plain_fails:
            raise libvirt.libvirtError("Requested operation is not valid: cannot undefine")
        return int(self.real.undefine())


@pytest.mark.parametrize("plain_fails", [False, True])
def test_an_undefine_failing_without_an_error_code_falls_back_to_the_plain_call(conn, monkeypatch, plain_fails):
    name = _name()
    conn.made.append(name)
    conn.define(_xml(name))
    dom = _CodelessFailure(conn.raw.lookupByName(name), plain_fails)
    real_lookup = conn._lookup
    monkeypatch.setattr(conn, "_lookup", lambda n: dom if n == name else real_lookup(n))
    if plain_fails:
        with pytest.raises(LibvirtError, match="cannot undefine"):
            conn.undefine(name)
        assert name in conn.raw.listDefinedDomains()
    else:
        assert conn.undefine(name) == []
        assert name not in conn.raw.listDefinedDomains()
    assert dom.calls == ["undefineFlags", "undefine"]


@pytest.mark.parametrize("uri", ["test:///\udc80", "test:///default\udcff", "qemu:///system\ud800"])
def test_a_uri_that_is_not_text_is_refused_before_libvirt(uri):
    # found by tests/fuzz: a non-UTF-8 byte in argv (surrogate-escaped by Python) reached libvirt.open and
    # escaped as UnicodeEncodeError with a traceback
    with pytest.raises(InvalidSpec, match="libvirt URI"):
        LibvirtConnection(uri)


def test_an_error_message_libvirt_cannot_decode_is_a_libvirt_error():
    # found by tests/fuzz: for test:///%80 libvirt's error text is not UTF-8; the binding then raises SystemError
    with pytest.raises(LibvirtError, match="not UTF-8"):
        LibvirtConnection("test:///%80", readonly=True).domains()


def test_a_pool_or_network_deleted_while_facts_are_read_is_left_out(conn, tmp_path, monkeypatch):
    # Seen in a CI-style run: another worker's test deleted its pool on the shared libvirtd between this
    # connection's listing and its read, and provisioning failed with "Storage pool not found".
    raw = conn.raw
    pool = raw.storagePoolDefineXML(f"<pool type='dir'><name>going</name><target><path>{tmp_path}</path>"
                                    "</target></pool>", 0)
    net = raw.networkDefineXML("<network><name>going-net</name><bridge name='vgpvgone0'/></network>")
    pools, nets = raw.listAllStoragePools(0), raw.listAllNetworks(0)
    assert "going" in [p.name() for p in pools] and "going-net" in [n.name() for n in nets]
    pool.undefine()
    net.undefine()
    monkeypatch.setattr(raw, "listAllStoragePools", lambda flags=0: pools)     # listed before the deletion
    monkeypatch.setattr(raw, "listAllNetworks", lambda flags=0: nets)
    facts = conn.facts()
    assert "going" not in facts.pools and "going-net" not in facts.networks
    assert "default-pool" in facts.pools and "default" in facts.networks      # the others are still read


class _Counted:
    """Counts each libvirt method called through it: the connection's, and those of the domains it hands out
    (each call is a round trip on a remote libvirt)."""

    def __init__(self, raw: object, calls: list[str] | None = None) -> None:
        self.raw = raw
        self.calls: list[str] = [] if calls is None else calls

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            self.calls.append(name)
            out = attr(*args, **kwargs)
            return _Counted(out, self.calls) if isinstance(out, libvirt.virDomain) else out
        return call


def _client_records(name: str) -> list[tuple[object, object]]:
    """(action, outcome) of the client log's records of domain ``name``."""
    return [(r["action"], r["outcome"]) for r in client_records() if r.get("domain") == name]


def test_a_domain_this_connection_defined_starts_in_one_call(conn, monkeypatch):
    """Over a remote libvirt each call is a round trip: define's own handle serves the start, which asks no state
    first; a start of a running domain converges with one question more, and records nothing."""
    name = "hd-" + uuid.uuid4().hex[:8]
    conn.made.append(name)
    counted = _Counted(conn.raw)
    monkeypatch.setattr(type(conn), "raw", property(lambda self: counted))
    assert conn.define(_xml(name)) == name
    conn.start(name)
    assert counted.calls == ["defineXML", "create"]
    assert conn.is_active(name)
    del counted.calls[:]
    conn.start(name)                                              # runs already: refused, asked, converged
    assert counted.calls == ["lookupByName", "create", "isActive"] and conn.is_active(name)
    assert _client_records(name) == [("define domain", "ok"), ("start domain", "ok")]


def test_a_start_that_fails_is_recorded_and_raised_with_libvirts_error(conn, monkeypatch):
    name = "hd-" + uuid.uuid4().hex[:8]
    conn.made.append(name)
    conn.define(_xml(name))

    class Refusing:
        def create(self) -> None:
            raise libvirt.libvirtError("no room for it")

        def isActive(self) -> int:
            return 0
    monkeypatch.setitem(conn._defined, name, Refusing())
    with pytest.raises(LibvirtError, match=r"start failed.*no room for it"):
        conn.start(name)
    assert _client_records(name) == [("define domain", "ok"), ("start domain", "failed")]
    assert not conn.is_active(name)


def test_a_domain_defined_anew_elsewhere_between_define_and_start_is_looked_up(conn):
    name = "hd-" + uuid.uuid4().hex[:8]
    conn.made.append(name)
    conn.define(_xml(name))
    conn.raw.lookupByName(name).undefine()                        # another client: gone, then a new one
    conn.raw.defineXML(_xml(name))
    conn.start(name)                                              # the old handle answers "no domain"
    assert conn.is_active(name)
    conn.destroy(name)
    conn.undefine(name)
    with pytest.raises(LibvirtError) as ei:                       # undefined: no handle is kept for it
        conn.start(name)
    assert ei.value.code == VIR_ERR_NO_DOMAIN


def test_a_call_that_succeeds_asks_nothing_of_the_retry_policy():
    """The policy (a tenacity.Retrying and its state, per call) is built only for a call that failed."""
    built: list[int] = []
    policy = retry_transient(attempts=3, max_wait=0)

    def counted_policy() -> tenacity.Retrying:
        built.append(1)
        return policy()

    c = LibvirtConnection("test:///default", retry=counted_policy)
    assert c._call(None, "get driver type", lambda: "test") == "test"
    assert built == []
    flaky = _Flaky(2)
    assert c._call("d1", "start", flaky) == "ok"
    assert built == [1] and flaky.calls == 3                      # the first failure counts as the policy's first


def test_define_with_the_callers_name_parses_nothing_and_refuses_a_name_the_xml_does_not_give(conn, monkeypatch):
    """A plan's define step knows the name it built the XML with: no parse per VM (lxml's parse also lets another
    thread take the interpreter). Where the XML's first <name> is another element's, it is parsed, and a name the
    XML does not give is refused, defining nothing."""
    import vgpuvirt.libvirt_conn as lc
    parsed: list[str] = []
    real = lc.parse_xml
    monkeypatch.setattr(lc, "parse_xml", lambda text: parsed.append(text) or real(text))
    one, two, three = ("dn-" + uuid.uuid4().hex[:8] for _ in range(3))
    conn.made.extend([one, two, three])
    assert conn.define(_xml(one), name=one) == one and parsed == []
    meta = _xml(two).replace("<name>", "<metadata><app xmlns='urn:x'><name>other</name></app></metadata><name>", 1)
    assert conn.define(meta, name=two) == two and len(parsed) == 1           # the first <name> is not the domain's
    assert "urn:x" in conn.xml(two)
    with pytest.raises(InvalidSpec, match=r"the name dn-x \(it names dn-"):
        conn.define(_xml(three), name="dn-x")
    with pytest.raises(InvalidSpec):
        conn.define(_xml(three), name="bad name")                              # a name no domain may have
    assert not conn.exists("dn-x") and not conn.exists(three)
    assert conn.define(_xml(three)) == three and len(parsed) == 3             # no name given: read from the XML


def test_a_start_that_gets_no_answer_is_recorded_and_asks_nothing_more(conn, monkeypatch):
    """A libvirt that stopped answering is not asked whether the domain runs: that question would wait out the
    bound again."""
    from vgpuvirt.libvirt_bound import LibvirtTimeout
    name = "hd-" + uuid.uuid4().hex[:8]
    conn.made.append(name)
    conn.define(_xml(name))
    asked: list[str] = []
    real = conn._call

    def call(domain, what, fn):
        asked.append(what)
        if what == "start":
            raise LibvirtTimeout("libvirt test:///default: start got no answer in 60 s", domain=domain, uri=conn.uri)
        return real(domain, what, fn)
    monkeypatch.setattr(conn, "_call", call)
    with pytest.raises(LibvirtTimeout):
        conn.start(name)
    assert asked == ["start"]
    assert _client_records(name) == [("define domain", "ok"), ("start domain", "failed")]
