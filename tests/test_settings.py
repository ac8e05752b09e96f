"""Settings fail closed: every ``ANIMEGAN_*`` setting, every class of wrong value, refused at start.

The cases are generated from the registry (``flask_animegan.config.SETTINGS``), so a new
setting is covered the day it is added: a value of the wrong type (a string for a
number or a switch, a float where a whole number is needed, a bool for a number), a
number out of range below and above, an unknown choice, and the values each setting's
own check refuses (rate limits flask-limiter cannot parse, URIs, mappings, names). Each is
refused by ``init_app`` (and, written as an environment string, by ``from_environ``) with
an error that names the key. The check runs before anything heavy in ``init_app``, so
these apps load no model and each case takes about a millisecond.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_animegan import AnimeGAN

REPO = Path(__file__).resolve().parent.parent
from flask_animegan.config import (
    ALIASES,
    DEFAULTS,
    MAX_FRAME_PIXELS,
    REGISTRY,
    SERVER_SETTINGS,
    SETTINGS,
    AnimeGANOptions,
    Derived,
    RemovedSettingWarning,
    ServerSettings,
    Setting,
    WHOLE_SIDE_LIMIT,
    SettingError,
    Settings,
    StorageURIs,
    from_environ,
    gunicorn_overrides,
    uri_scheme,
)

#: Strings each checked setting refuses, beyond its type and range (config.py's checks).
REFUSED_STRINGS: dict[str, list[Any]] = {
    "ANIMEGAN_RATE_LIMIT": ["5 per minit", "2 per minit", "five per minute", "5/minit", "5",
                            "per minute", "5 per minute;", "0 per minute", "5 per minute or so",
                            "5 per 0 minutes", "5/0 seconds", "1 per hour;5 per 00 minutes"],
    "ANIMEGAN_STORAGE_URI": ["", "localhost:6379", "redis:6379", "http://cache:6379",
                             "memcached://cache:11211"],
    "ANIMEGAN_STATE_STORAGE_URI": ["localhost:6380", "redis:6380", "http://state:6380",
                                   "memcached://state:11211"],
    "ANIMEGAN_URL_PREFIX": ["", "animegan", "animegan/", "//evil.example", "/a//b", "/a b",
                            "/anime?x=1", "/anime#top", "/tools/../anime", "/./anime", "/\\x"],
    "ANIMEGAN_WEIGHTS_BASE_URL": ["mirror.local/weights", "ftp://mirror/weights",
                                  "https://"],
    "ANIMEGAN_CONTENT_BLOCK": ["", "my block", "1content", "content}"],
    "ANIMEGAN_MODELS_DIR": [""],
    # files that cannot be read, keys that do not match: tests/test_labels.py
    "ANIMEGAN_C2PA_CERT": [""],
    "ANIMEGAN_C2PA_KEY": [""],
    "ANIMEGAN_PORTRAIT_SCENE_STYLE": [""],  # a name that is not installed: tests/test_options.py
    "ANIMEGAN_BASE_TEMPLATE": [""],
    "ANIMEGAN_CONTENT_SECURITY_POLICY": ["default-src 'self'\nX-Injected: 1", "default-src 'self'\r",
                                         "default-src \u2019self\u2019", "default-src 'self' \x00"],
    "ANIMEGAN_PAGE_DECORATORS": ["login_required", ["flask_login."], [5], ["a b.c"]],
    "ANIMEGAN_API_DECORATORS": ["login_required", [None], ["flask_login..login_required"]],
    "ANIMEGAN_ADMIN_CHECK": ["is_admin", "site.", "a b.c", ".site"],
    "ANIMEGAN_RENDER_TEMPLATE": ["render_template", "flask.", "flask..render_template"],
    "ANIMEGAN_RATE_LIMIT_KEY": ["client_key", "site.", "a b.c", ".site"],
    "ANIMEGAN_EXTRA_STYLES": [{"mine": "https://x/mine.pt"}, {"mine": ["url", "sha1"]},
                              {"Bad Name": {"url": "https://x", "sha1": "0" * 40}},
                              {"mine": {"url": "https://x/mine.pt"}},
                              {"mine": {"url": "https://x/mine.pt", "sha1": "xyz"}},
                              {"mine": {"url": "https://x/mine.pt", "sha1": "0" * 40,
                                        "licence": "CC BY 4.0"}}],
    "ANIMEGAN_ALLOWED_LICENCES": [[], ["MIT OR Apache-2.0"], ["CC BY 4.0"], [5], ["-MIT"],
                                  "MIT OR Apache-2.0", '["MIT", 5]', '["MIT"', "[]"],
}
#: Values each checked setting takes, beyond its default.
ACCEPTED_STRINGS: dict[str, list[Any]] = {
    "ANIMEGAN_RATE_LIMIT": ["", "1 per second", "5/minute", "5/minute;100/day",
                            "10 per hour, 100 per day", "2 per 30 seconds", "10 per 10 minutes",
                            "100/20 seconds"],
    "ANIMEGAN_STORAGE_URI": ["memory://", "redis://localhost:6379/0", "rediss://:pw@cache:6380/1",
                             "unix:///run/redis.sock"],
    # empty, as from an empty environment variable: unset
    "ANIMEGAN_STATE_STORAGE_URI": ["", "memory://", "redis://localhost:6380/0",
                                   "unix:///run/redis-state.sock"],
    "ANIMEGAN_URL_PREFIX": ["/", "/anime", "/tools/anime", "/tools/anime/", "/a-b_c.d~e"],
    "ANIMEGAN_WEIGHTS_BASE_URL": ["", "http://127.0.0.1:8080/weights", "https://mirror.example"],
    "ANIMEGAN_EXTRA_STYLES": [{"mine": {"url": "https://x/mine.pt", "sha1": "0" * 40,
                                        "licence": "CC-BY", "face": True}}],
    "ANIMEGAN_ALLOWED_LICENCES": [["MIT", "CC-BY-4.0", "own"],
                                  ["LicenseRef-AnimeGANv2-NonCommercial"]],
    "ANIMEGAN_PAGE_DECORATORS": [["flask_login.login_required"], ["site.auth:members", "a.b"]],
    "ANIMEGAN_API_DECORATORS": [["flask_login.login_required"]],
    "ANIMEGAN_ADMIN_CHECK": ["site.auth.is_admin", "site.auth:is_admin"],
    "ANIMEGAN_RENDER_TEMPLATE": ["flask:render_template", "site.themes:render"],
    "ANIMEGAN_RATE_LIMIT_KEY": ["site.auth.animegan_client", "site.auth:animegan_client"],
}
#: Settings that need another one to make a valid example valid (rules between settings).
COMPANIONS: dict[str, dict[str, Any]] = {
    "ANIMEGAN_CONTENT_BLOCK": {"ANIMEGAN_BASE_TEMPLATE": "layout.html"},
    "ANIMEGAN_MAX_OUTPUT_SIDE": {"ANIMEGAN_MAX_SIDE": 16},
}


def wrong_types(setting: Setting) -> list[Any]:
    """Values of another type than ``setting``'s: the typos a site owner makes."""
    missing = [] if setting.optional else [None]
    if setting.kind is bool:
        return ["false", "true", "0", 1, 0, 1.0, *missing]
    if setting.kind is int:
        example = setting.example()
        return [str(example), f"{example}", float(example) + 0.5, float(example), True, False,
                [example], *missing]
    if setting.kind is float:
        return [str(setting.example()), "1e3", True, False, [1.0], *missing]
    if setting.kind is dict:
        return ['{"mine": {}}', [], [("mine", {})], "", *missing]
    if setting.kind is list:
        return [5, 0.5, True, b"bytes", "a", {"a": 1}, *missing]
    return [5, 0.5, True, b"bytes", ["a"], {"a": 1}, *missing]  # str


def out_of_range(setting: Setting) -> list[Any]:
    if setting.kind not in (int, float):
        return []
    values: list[Any] = []
    step = 1 if setting.kind is int else 0.001
    if setting.low is not None:
        values += [setting.kind(setting.low - step), setting.kind(setting.low - 1000)]
    if setting.high is not None:
        values += [setting.kind(setting.high + step), setting.kind(setting.high * 1000)]
    if setting.kind is float:
        values += [math.nan, math.inf, -math.inf]
    return values


def unknown_choices(setting: Setting) -> list[Any]:
    if not setting.choices:
        return []
    first = setting.choices[0]
    return ["", "nope", first.upper(), f" {first}", f"{first}s", "jpg" if first == "jpeg" else
            first[:-1]]


def wrong_values(setting: Setting) -> list[tuple[str, Any]]:
    """Every wrong value of one setting, with its class."""
    return ([("type", v) for v in wrong_types(setting)]
            + [("range", v) for v in out_of_range(setting)]
            + [("choice", v) for v in unknown_choices(setting)]
            + [("check", v) for v in REFUSED_STRINGS.get(setting.name, [])])


CASES = [pytest.param(s.name, value, id=f"{s.name}-{kind}-{value!r}"[:90])
         for s in SETTINGS for kind, value in wrong_values(s)]


def environment_strings(setting: Setting) -> list[str]:
    """Wrong values as they arrive from the environment: always strings."""
    if setting.kind is bool:
        return ["maybe", "2", "ja", "truee", "false!"]
    if setting.kind is dict:
        return ["not json", "[]", '"mine"', "1", '{"mine": "x"}']
    strings: list[str] = []
    if setting.kind in (int, float):
        strings += ["abc", "12abc", "1,5", "0x10"]
        if setting.kind is int:
            strings += ["2.5", "1e3"]
        if not setting.optional:
            strings += ["", "   "]
        strings += [repr(v) for v in out_of_range(setting) if not isinstance(v, float)
                    or math.isfinite(v)]
        if setting.kind is float:
            strings += ["nan", "inf"]
    strings += [c for c in unknown_choices(setting) if isinstance(c, str)]
    strings += [v for v in REFUSED_STRINGS.get(setting.name, []) if isinstance(v, str)
                and not (v == "" and setting.optional)]
    return strings


ENV_CASES = [pytest.param(s.name, raw, id=f"{s.name}-{raw!r}"[:90])
             for s in REGISTRY for raw in environment_strings(s)]


SERVER_NAMES = {s.name for s in SERVER_SETTINGS}


def build(tmp_path: Path, **config: Any) -> Flask:
    app = Flask("settings_test")
    app.config.update({"SECRET_KEY": "settings test", "ANIMEGAN_MODELS_DIR": str(tmp_path),
                       "ANIMEGAN_WARMUP_SIZE": 0, **config})
    AnimeGAN(app)
    return app


def test_every_setting_has_wrong_values_and_every_check_its_cases():
    assert len(SETTINGS) >= 40
    for setting in SETTINGS:
        assert wrong_values(setting), setting.name
        assert environment_strings(setting) or setting.kind is str, setting.name
        if setting.kind in (int, float):
            assert setting.low is not None and setting.high is not None, (
                f"{setting.name}: every number has a range in the registry")
        if setting.check is not None:
            assert setting.name in REFUSED_STRINGS, f"{setting.name}: give its refused values"
    assert not set(REFUSED_STRINGS) - {s.name for s in SETTINGS}
    assert "ANIMEGAN_COLOR_TOLERANCE" not in DEFAULTS and "ANIMEGAN_LOCAL_TOLERANCE" not in DEFAULTS


@pytest.mark.parametrize("key,value", CASES)
def test_init_app_refuses_a_wrong_value_naming_the_key(tmp_path, key, value):
    app = Flask("settings_test")
    app.config.update({"ANIMEGAN_MODELS_DIR": str(tmp_path), key: value})
    with pytest.raises(RuntimeError, match=f"configuration error: .*{key}") as error:
        AnimeGAN(app)
    message = str(error.value)
    fixes = ("give", "use", "write", "set", "unset", "must", "needs", "lowercase letters")
    assert any(word in message for word in fixes), (
        f"the error should say what to do: {message}")
    assert "animegan" not in app.extensions  # nothing half-made is left behind
    assert not app.blueprints


@pytest.mark.parametrize("key,value", CASES)
def test_a_wrong_keyword_option_is_refused_the_same_way(tmp_path, key, value):
    app = Flask("settings_test")
    app.config["ANIMEGAN_MODELS_DIR"] = str(tmp_path)
    option = key.removeprefix("ANIMEGAN_").lower()
    if key == "ANIMEGAN_MODELS_DIR":
        app.config.pop(key)
    with pytest.raises(RuntimeError, match=key):
        AnimeGAN(app, **{option: value})


@pytest.mark.parametrize("key,raw", ENV_CASES)
def test_from_environ_refuses_a_wrong_string_naming_the_variable(key, raw):
    read = ServerSettings.from_environ if key in SERVER_NAMES else from_environ
    with pytest.raises(SettingError, match=f"environment variable {key}=") as error:
        read({key: raw})
    assert error.value.key == key


def valid_values(setting: Setting) -> list[Any]:
    values = [setting.default, *setting.choices, *ACCEPTED_STRINGS.get(setting.name, [])]
    if setting.kind in (int, float):
        assert setting.low is not None and setting.high is not None
        values += [setting.kind(setting.low), setting.kind(setting.high)]
        if setting.kind is float:
            values += [math.ceil(setting.low), (setting.low + setting.high) / 2]
    if setting.optional and setting.check is None:
        values.append(setting.kind(setting.low) if setting.low is not None else "x")
    if setting.kind is str and not setting.choices and setting.check is None:
        values += ["", "some value"]
    return values


VALID = [pytest.param(s.name, v, id=f"{s.name}-{v!r}"[:90])
         for s in SETTINGS for v in valid_values(s)]


@pytest.mark.parametrize("key,value", VALID)
def test_valid_values_are_accepted(key, value):
    config = {**COMPANIONS.get(key, {}), key: value}
    settings = Settings.from_config(config)
    assert getattr(settings, key.removeprefix("ANIMEGAN_").lower()) == value


@pytest.mark.parametrize("key,value", VALID)
def test_valid_values_round_trip_through_the_environment(key, value):
    setting = next(s for s in SETTINGS if s.name == key)
    if value is None and setting.kind is str:
        pytest.skip("an unset string setting is an absent variable (empty is a value)")
    if value is None or (setting.kind is dict):
        raw = "" if value is None else json.dumps(value)
    elif setting.kind is list:
        raw = ", ".join(value)
    elif setting.kind is bool:
        raw = "true" if value else "false"
    else:
        raw = str(value)
    converted = from_environ({key: raw})[key]
    assert converted == value and type(converted) is type(value) or (
        setting.kind is float and converted == float(value))


def test_the_defaults_start_an_app(tmp_path):
    app = build(tmp_path)
    service = app.extensions["animegan"]
    assert service.settings == Settings(models_dir=str(tmp_path), warmup_size=0)
    assert {k: v for k, v in app.config.items() if k.startswith("ANIMEGAN_")} == {
        **DEFAULTS, "ANIMEGAN_MODELS_DIR": str(tmp_path), "ANIMEGAN_WARMUP_SIZE": 0}


def test_environment_values_start_an_app(tmp_path):
    environ = {"ANIMEGAN_MAX_SIDE": "384", "ANIMEGAN_CSRF": "false", "ANIMEGAN_TORCH_THREADS": "",
               "ANIMEGAN_QUEUE_TIMEOUT": "2.5", "ANIMEGAN_RATE_LIMIT": "10 per minute",
               "ANIMEGAN_EXTRA_STYLES": '{"mine": {"url": "https://x/m.pt", "sha1": "%s"}}'
                                        % ("a" * 40)}
    app = build(tmp_path, **from_environ(environ))
    settings = app.extensions["animegan"].settings
    assert (settings.max_side, settings.csrf, settings.torch_threads) == (384, False, None)
    assert settings.queue_timeout == 2.5 and settings.rate_limit == "10 per minute"


@pytest.mark.parametrize("config,key", [
    ({"ANIMEGAN_CONTENT_BLOCK": "content"}, "ANIMEGAN_CONTENT_BLOCK"),
    ({"ANIMEGAN_MAX_SIDE": 512, "ANIMEGAN_MAX_OUTPUT_SIDE": 384}, "ANIMEGAN_MAX_OUTPUT_SIDE"),
    ({"ANIMEGAN_C2PA_CERT": "chain.pem"}, "ANIMEGAN_C2PA_KEY"),
    ({"ANIMEGAN_C2PA_KEY": "key.pem"}, "ANIMEGAN_C2PA_CERT"),
])
def test_rules_between_settings_are_checked_at_start(tmp_path, config, key):
    with pytest.raises(RuntimeError, match=key):
        build(tmp_path, **config)


@pytest.mark.parametrize("config,keys", [
    ({"ANIMEGAN_MAX_SIDE": 2048}, ("ANIMEGAN_MAX_SIDE", "ANIMEGAN_MAX_OUTPUT_SIDE=2048")),
    ({"ANIMEGAN_MAX_SIDE": 8192, "ANIMEGAN_MAX_OUTPUT_SIDE": 8192},
     ("ANIMEGAN_MAX_SIDE", "ANIMEGAN_MAX_OUTPUT_SIDE")),
    ({"ANIMEGAN_PRECISION": "int8", "ANIMEGAN_BACKEND": "torch"},
     ("ANIMEGAN_PRECISION", "ANIMEGAN_BACKEND")),
])
def test_settings_that_would_hurt_the_process_stop_the_app_naming_the_keys(
        tmp_path, config, keys):
    """A whole-picture size over the memory budget, INT8 on torch: refused at start."""
    with pytest.raises(RuntimeError, match="configuration error") as error:
        build(tmp_path, **config)
    assert all(key in str(error.value) for key in keys), str(error.value)


@pytest.mark.parametrize("config", [
    {"ANIMEGAN_MAX_SIDE": WHOLE_SIDE_LIMIT, "ANIMEGAN_MAX_OUTPUT_SIDE": 8192},
    {"ANIMEGAN_PRECISION": "int8", "ANIMEGAN_BACKEND": "auto"},
    {"ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_BACKEND": "torch"},
])
def test_their_neighbours_start(tmp_path, config):
    app = build(tmp_path, **config)
    settings = app.extensions["animegan"].settings
    assert all(getattr(settings, key.removeprefix("ANIMEGAN_").lower()) == value
               for key, value in config.items())


@pytest.mark.parametrize("name,hint", [
    ("nope", "neither installed nor"), ("papriak", "did you mean 'paprika'"),
    ("Toon_Demo", "did you mean 'toon_demo'"), ("toon_demo.pt", "not a style name"),
    ("toon demo", "not a style name")])
def test_a_default_style_that_can_never_serve_is_refused_at_start(tmp_path, name, hint):
    """Installed styles are known only once the models folder is read, so this check runs
    in init_app beside the registry's (it used to start, then answer every request 404)."""
    with pytest.raises(RuntimeError, match="configuration error: ANIMEGAN_DEFAULT_STYLE") as error:
        build(tmp_path, ANIMEGAN_DEFAULT_STYLE=name)
    assert hint in str(error.value) and "unset it" in str(error.value)


def test_an_official_style_not_pulled_yet_may_be_the_default(tmp_path):
    """So that `flask animegan pull paprika` runs with ANIMEGAN_DEFAULT_STYLE=paprika set;
    meanwhile a conversion says what to run."""
    client = build(tmp_path, ANIMEGAN_DEFAULT_STYLE="paprika", ANIMEGAN_CSRF=False).test_client()
    refused = client.post("/animegan/convert", data=b"not even read", content_type="image/jpeg")
    assert "flask animegan pull paprika" in refused.get_json()["error"]
    assert build(tmp_path, ANIMEGAN_DEFAULT_STYLE="toon_demo").extensions["animegan"]


def test_one_state_storage_serves_the_counts_the_pages_and_the_jobs():
    """Our stores take unix://, flask-limiter spells it redis+unix://: one URI serves both."""
    default = Derived.from_settings(Settings()).storage
    assert default == StorageURIs("memory://", "memory://", "memory://", "ANIMEGAN_STORAGE_URI")
    shared = Derived.from_settings(Settings(storage_uri="unix:///run/redis.sock")).storage
    assert (shared.state, shared.limiter) == ("unix:///run/redis.sock",
                                              "redis+unix:///run/redis.sock")
    own = Derived.from_settings(Settings(storage_uri="redis://cache:6379/0",
                                         state_storage_uri="rediss://:pw@state:6380/1")).storage
    assert (own.cache, own.state, own.limiter, own.state_key) == (
        "redis://cache:6379/0", "rediss://:pw@state:6380/1", "rediss://:pw@state:6380/1",
        "ANIMEGAN_STATE_STORAGE_URI")
    assert Settings(state_storage_uri="redis://state:6380/0").job_queue_kind == "rq"
    assert [uri_scheme(u) for u in ("REDIS://x", "unix:///s", "memory://", "x")] == [
        "redis", "unix", "memory", ""]


def test_an_unknown_key_is_refused_naming_the_likely_setting(tmp_path):
    """A mistyped key is a setting its owner believes in force (here: a stricter limit)."""
    with pytest.raises(RuntimeError, match="ANIMEGAN_RATE_LIMITS is not a setting; did you "
                                           "mean ANIMEGAN_RATE_LIMIT?"):
        build(tmp_path, ANIMEGAN_RATE_LIMITS="1 per minute")
    # removed settings are refused too, rather than silently doing nothing
    with pytest.raises(RuntimeError, match="ANIMEGAN_LOCAL_TOLERANCE is not a setting"):
        build(tmp_path, ANIMEGAN_LOCAL_TOLERANCE=1.75)


def test_config_changed_after_init_app_is_not_read(tmp_path):
    """The contract of init_app's docstring: config is read once."""
    app = build(tmp_path, ANIMEGAN_URL_PREFIX="/anime")
    app.config["ANIMEGAN_URL_PREFIX"] = "/elsewhere"
    app.config["ANIMEGAN_TRUSTED_PROXIES"] = "junk"
    assert app.extensions["animegan"].settings.url_prefix == "/anime"
    assert app.test_client().get("/anime/styles").status_code == 200


# -- the registry's size, old names, gunicorn's settings, the derived groups ----------------
def test_the_registry_is_one_list_of_at_most_59_names():
    names = [s.name for s in REGISTRY]
    assert len(names) == len(set(names)) <= 59
    assert not set(ALIASES) & set(names)  # an old name is no setting
    assert all(alias.new in names for alias in ALIASES.values() if alias.new)
    # AnimeGAN(**options) is typed by a TypedDict kept equal to the app's fields
    assert set(AnimeGANOptions.__annotations__) == {s.field for s in SETTINGS}


def old_value(old: str) -> Any:
    """A value the old name took that its replacement takes too."""
    if "STORAGE_URI" in old:
        return "memory://"
    return {"ANIMEGAN_JOB_TTL": 120, "ANIMEGAN_THREADS": 6}.get(old, 7)


APP_ALIASES = [old for old, alias in ALIASES.items() if not alias.server]
SERVER_ALIASES = [old for old, alias in ALIASES.items() if alias.server]


def expected_words(old: str) -> str:
    alias = ALIASES[old]
    return alias.new or alias.fix.split(",")[0]


@pytest.mark.parametrize("old", APP_ALIASES)
def test_every_old_name_starts_the_app_with_one_warning_naming_its_replacement(tmp_path, old):
    with pytest.warns(RemovedSettingWarning) as warned:
        app = build(tmp_path, **{old: old_value(old)})
    assert len(warned) == 1 and old in str(warned[0].message)
    assert expected_words(old) in str(warned[0].message)
    assert old not in app.config  # taken out, so that no part reads it
    alias = ALIASES[old]
    if alias.new:  # a renamed key's value counts under its new name
        settings = app.extensions["animegan"].settings
        assert getattr(settings, alias.new.removeprefix("ANIMEGAN_").lower()) == old_value(old)


@pytest.mark.parametrize("old", APP_ALIASES)
def test_old_names_warn_once_from_the_environment_and_as_options(tmp_path, old):
    with pytest.warns(RemovedSettingWarning) as warned:
        found = from_environ({old: str(old_value(old))})
    assert len(warned) == 1 and expected_words(old) in str(warned[0].message)
    assert found == ({ALIASES[old].new: old_value(old)} if ALIASES[old].new else {})
    app = Flask("settings_test")
    app.config.update(SECRET_KEY="x", ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_WARMUP_SIZE=0)
    with pytest.warns(RemovedSettingWarning) as warned:
        AnimeGAN(app, **{old.removeprefix("ANIMEGAN_").lower(): old_value(old)})
    assert len(warned) == 1 and "animegan" in app.extensions


def test_a_new_name_wins_over_its_old_one(tmp_path):
    with pytest.warns(RemovedSettingWarning, match="ANIMEGAN_JOB_TTL"):
        app = build(tmp_path, ANIMEGAN_JOB_TTL=120, ANIMEGAN_RESULT_TTL=600)
    assert app.extensions["animegan"].settings.result_ttl == 600
    with pytest.warns(RemovedSettingWarning):
        assert from_environ({"ANIMEGAN_JOB_TTL": "120", "ANIMEGAN_RESULT_TTL": "600"}) == {
            "ANIMEGAN_RESULT_TTL": 600}


@pytest.mark.parametrize("old", SERVER_ALIASES)
def test_old_gunicorn_names_warn_once_and_still_apply(old):
    alias = ALIASES[old]
    with pytest.warns(RemovedSettingWarning) as warned:
        server = ServerSettings.from_environ({old: "6"})
        overrides = gunicorn_overrides({old: "6"})
    assert len(warned) == 1 and expected_words(old) in str(warned[0].message)
    if alias.new:
        assert server.server_threads == 6 and not overrides
    else:
        assert overrides == {alias.gunicorn: "6"}


def run_gunicorn_conf(**environ: str) -> subprocess.CompletedProcess[str]:
    """gunicorn.conf.py loaded as gunicorn loads it, in a fresh process."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANIMEGAN_")}
    code = ("import json, runpy; conf = runpy.run_path('gunicorn.conf.py'); print(json.dumps("
            "{k: conf[k] for k in ('threads', 'bind', 'accesslog', 'timeout', "
            "'control_socket_disable')}))")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, **environ},
                          capture_output=True, text=True)


def test_gunicorn_conf_reads_the_registry():
    conf = json.loads(run_gunicorn_conf(ANIMEGAN_MAX_QUEUE="8", ANIMEGAN_ACCESS_LOG="",
                                        ANIMEGAN_CONTROL_SOCKET="/run/x.ctl").stdout)
    assert conf == {"threads": 23, "bind": "127.0.0.1:8000", "accesslog": None,
                    "timeout": 120, "control_socket_disable": False}
    old = run_gunicorn_conf(ANIMEGAN_THREADS="16", ANIMEGAN_BIND="0.0.0.0:9000")
    assert json.loads(old.stdout.splitlines()[-1])["threads"] == 16
    assert json.loads(old.stdout.splitlines()[-1])["bind"] == "0.0.0.0:9000"
    assert old.stderr.count("RemovedSettingWarning") == 2
    assert "ANIMEGAN_SERVER_THREADS" in old.stderr and "--bind" in old.stderr
    wrong = run_gunicorn_conf(ANIMEGAN_SERVER_THREADS="0")
    assert wrong.returncode and "environment variable ANIMEGAN_SERVER_THREADS=" in wrong.stderr


def test_the_derived_groups_are_built_once_and_reach_every_part(tmp_path):
    settings = Settings(max_frames=100, max_seconds=60.0, max_pixels=1000, max_decode_bytes=2000,
                        decode_isolation="thread", portrait_max_faces=12)
    derived = Derived.from_settings(settings)
    assert (derived.media.max_frames, derived.media.max_seconds) == (100, 60.0)
    assert derived.media.max_total_pixels == 100 * MAX_FRAME_PIXELS
    assert (derived.decode.max_pixels, derived.decode.max_bytes) == (1000, 2000)
    assert derived.portrait.max_faces == 12
    assert settings.job_timeout == 300  # 3 s a frame
    service = build(tmp_path, ANIMEGAN_MAX_FRAMES=100, ANIMEGAN_MAX_SECONDS=60.0,
                    ANIMEGAN_MAX_PIXELS=1000, ANIMEGAN_MAX_DECODE_BYTES=2000,
                    ANIMEGAN_DECODE_ISOLATION="thread",
                    ANIMEGAN_PORTRAIT_MAX_FACES=12).extensions["animegan"]
    # the decoder (photos, frames, audio), the converter and the jobs read the same groups
    assert service.decoder.limits == derived.decode and service.decoder.media == derived.media
    assert service.decoder.isolation == "thread"
    assert service.converter.portrait == derived.portrait
    assert service.jobs.converter.decoder is service.decoder


def test_a_gunicorn_setting_in_app_config_is_refused_without_a_wrong_guess(tmp_path):
    with pytest.raises(RuntimeError, match="ANIMEGAN_SERVER_THREADS is not a setting; remove") \
            as error:
        build(tmp_path, ANIMEGAN_SERVER_THREADS=8)
    assert "TORCH_THREADS" not in str(error.value)


def test_a_socket_in_flask_limiters_spelling_is_taken_for_the_state_storage():
    with pytest.warns(RemovedSettingWarning, match="ANIMEGAN_STATE_STORAGE_URI"):
        found = from_environ({"ANIMEGAN_RATELIMIT_STORAGE_URI": "redis+unix:///run/r.sock"})
    assert found == {"ANIMEGAN_STATE_STORAGE_URI": "unix:///run/r.sock"}
