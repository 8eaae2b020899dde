"""A flag declared from its config field (flag_fields.py) keeps what the field says: each role
parsed without flags runs with every section's default config, a number flag parses to its
field's type and refuses other text naming the flag, --help shows each flag's help with its
field's default, and an entry the field cannot describe fails when the table is built."""

from __future__ import annotations

import contextlib
import io

import msgspec
import pytest

from minipd.control.role import Role
from minipd.entrypoints.config_sections import SECTIONS
from minipd.entrypoints.configs import role_configs
from minipd.entrypoints.flag_fields import field_default, flag
from minipd.entrypoints.flag_spec import ALL, COMMAND_ROLES, ENGINE_ROLES, INSTANCES, PROCESS, ROUTING, Flag
from minipd.entrypoints.flags import FLAGS, build_parser

# sections a role builds only when asked for (None without their flag), and those only some roles build
NONE_WITHOUT_FLAGS = {"http", "ratio_controller"}
BUILT_BY = {"engine": ENGINE_ROLES, "router": ROUTING}
# flags whose type the table derives, each with the type a reader expects; the list spans the
# sections, None defaults (`int | None`) and flags shared by several roles
EXPECTED_TYPES = {
    "--block-size": int,
    "--max-num-seqs": int,
    "--link-gbps": float,
    "--lease-s": float,
    "--torch-threads": int,
    "--shutdown-timeout-s": float,
    "--max-connections": int,
    "--kv-admission-ratio": float,
    "--migration-limit": int,
    "--controller-target": float,
    "--controller-min-samples": int,
    "--max-waiting-requests": int,
    "--num-decode": int,
    "--min-decode": int,
    "--scale-cooldown-s": float,
    "--seed": int,
    "--top-p": float,
}


def _parse(role: Role, *argv: str):
    return build_parser(role).parse_args(["--role", role.value, *argv])


def _flag(name: str) -> Flag:
    (found,) = [f for f in FLAGS if f.name == name]
    return found


def _role_of(flag: Flag) -> Role:
    return next(r for r in COMMAND_ROLES if r in flag.roles)


@pytest.mark.parametrize("role", COMMAND_ROLES, ids=lambda r: r.value)
def test_no_flags_give_every_sections_default_config(role, monkeypatch):
    monkeypatch.delenv("MINIPD_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("MINIPD_API_KEY", raising=False)
    configs = role_configs(role, _parse(role))
    for name, default in SECTIONS.items():
        got = getattr(configs, name)
        if name in NONE_WITHOUT_FLAGS or role not in BUILT_BY.get(name, COMMAND_ROLES):
            assert got is None, name
        elif name == "instance" and role is Role.BOTH:  # no control port unless --control-port is given
            assert got == msgspec.structs.replace(default(), port=None)
        else:
            assert got == default(), f"{role.value}: {name} is not its default config with no flags given"
    if role in ROUTING:  # the controller's flags, off: its default policy all the same
        assert configs.controller_policy == SECTIONS["ratio_controller"]()


@pytest.mark.parametrize("name, kind", EXPECTED_TYPES.items())
def test_a_number_flag_parses_to_its_type_and_refuses_other_text(name, kind, capsys):
    role = _role_of(_flag(name))
    value = getattr(_parse(role, name, "3"), _flag(name).dest)
    assert type(value) is kind and value == 3
    with pytest.raises(SystemExit) as exited:
        _parse(role, name, "x1")
    assert exited.value.code == 2
    assert f"argument {name}: invalid {kind.__name__} value: 'x1'" in capsys.readouterr().err


def test_every_flag_with_a_number_default_reads_it_back_as_that_number():
    checked = 0
    for f in FLAGS:
        default = field_default(f.sets[0]) if f.options.get("action") is None else None
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            value = getattr(_parse(_role_of(f), f.name, str(default)), f.dest)
            assert type(value) is type(default) and value == default, f"{f.name} parses {default!r} as {value!r}"
            checked += 1
    assert checked > 30


@pytest.mark.parametrize("role", COMMAND_ROLES, ids=lambda r: r.value)
def test_help_shows_each_flag_with_its_fields_default(role, monkeypatch):
    monkeypatch.delenv("MINIPD_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("MINIPD_API_KEY", raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _parse(role, "--help")
    shown = "".join(out.getvalue().split())  # argparse wraps lines, and breaks words at hyphens
    for f in FLAGS:
        if role not in f.roles:
            continue
        help_text = f.options["help"]
        assert len(help_text.split()) > 2, f"{f.name} has no help"
        if "%(default)s" in help_text:
            # the field's default; the SLO's as its words are typed (its field holds them parsed)
            slo = f.sets[0] == "ratio_controller.policy.slo"
            help_text = help_text % {"default": f.options["default"] if slo else field_default(f.sets[0])}
        assert "".join(help_text.split()) in shown, f"{role.value} --help: {f.name}"


def _entry(sets: str, **options):
    return flag("--x", sets=sets, help="a test flag", roles=ALL, group=PROCESS, inherit=INSTANCES, **options)


def test_an_entry_takes_its_fields_default_and_type_unless_it_gives_its_own():
    assert _entry("engine.scheduler.max_num_seqs").options == {"default": 64, "type": int, "help": "a test flag"}
    assert _entry("transport.link_gbps").options["type"] is float  # float | None
    assert _entry("process.host").options == {"default": "127.0.0.1", "help": "a test flag"}  # text as typed
    off = _entry("instance.port", default=None)
    assert off.options["default"] is None and off.options["type"] is int
    listed = _entry("demo.prompts", action="append")
    assert listed.options["default"] == [] and "type" not in listed.options
    assert listed.options["default"] is not _entry("demo.prompts", action="append").options["default"]
    assert _entry("demo.sampling.max_tokens").options["default"] == 32, "the demo's own sampling default"


def test_an_entry_its_field_cannot_describe_fails_at_build_time():
    with pytest.raises(TypeError, match="instance.router: a field of type .* needs the flag's own `type`"):
        _entry("instance.router")
    assert _entry("instance.router", type=str).options["type"] is str
    with pytest.raises(
        TypeError, match="engine.fused_decode is a bool; its flag needs action store_true or store_false"
    ):
        _entry("engine.fused_decode")
    with pytest.raises(ValueError, match="engine.fused_decode: store_true does not leave the field.s default"):
        _entry("engine.fused_decode", action="store_true")
    with pytest.raises(AttributeError, match="engine.no_such_field: EngineConfig has no field"):
        _entry("engine.no_such_field")
