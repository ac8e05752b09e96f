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
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_animegan import AnimeGAN
from flask_animegan.config import (
    DEFAULTS,
    SETTINGS,
    Setting,
    SettingError,
    Settings,
    from_environ,
)

#: Strings each checked setting refuses, beyond its type and range (config.py's checks).
REFUSED_STRINGS: dict[str, list[Any]] = {
    "ANIMEGAN_RATE_LIMIT": ["5 per minit", "2 per minit", "five per minute", "5/minit", "5",
                            "per minute", "5 per minute;", "0 per minute", "5 per minute or so",
                            "5 per 0 minutes", "5/0 seconds", "1 per hour;5 per 00 minutes"],
    "ANIMEGAN_STORAGE_URI": ["", "localhost:6379", "redis:6379", "http://cache:6379",
                             "memcached://cache:11211"],
    "ANIMEGAN_RATELIMIT_STORAGE_URI": ["localhost:6379", "redis:6379"],
    "ANIMEGAN_RESULT_STORAGE_URI": ["localhost:6380", "redis:6380", "http://state:6380"],
    "ANIMEGAN_URL_PREFIX": ["", "animegan", "animegan/", "//evil.example", "/a//b", "/a b",
                            "/anime?x=1", "/anime#top", "/tools/../anime", "/./anime", "/\\x"],
    "ANIMEGAN_WEIGHTS_BASE_URL": ["mirror.local/weights", "ftp://mirror/weights",
                                  "https://"],
    "ANIMEGAN_CONTENT_BLOCK": ["", "my block", "1content", "content}"],
    "ANIMEGAN_MODELS_DIR": [""],
    "ANIMEGAN_PORTRAIT_SCENE_STYLE": [""],  # a name that is not installed: tests/test_options.py
    "ANIMEGAN_BASE_TEMPLATE": [""],
    "ANIMEGAN_CONTENT_SECURITY_POLICY": ["default-src 'self'\nX-Injected: 1", "default-src 'self'\r",
                                         "default-src \u2019self\u2019", "default-src 'self' \x00"],
    "ANIMEGAN_PAGE_DECORATORS": ["login_required", ["flask_login."], [5], ["a b.c"]],
    "ANIMEGAN_API_DECORATORS": ["login_required", [None], ["flask_login..login_required"]],
    "ANIMEGAN_ADMIN_CHECK": ["is_admin", "site.", "a b.c", ".site"],
    "ANIMEGAN_EXTRA_STYLES": [{"mine": "https://x/mine.pt"}, {"mine": ["url", "sha1"]},
                              {"Bad Name": {"url": "https://x", "sha1": "0" * 40}},
                              {"mine": {"url": "https://x/mine.pt"}},
                              {"mine": {"url": "https://x/mine.pt", "sha1": "xyz"}}],
}
#: Values each checked setting takes, beyond its default.
ACCEPTED_STRINGS: dict[str, list[Any]] = {
    "ANIMEGAN_RATE_LIMIT": ["", "1 per second", "5/minute", "5/minute;100/day",
                            "10 per hour, 100 per day", "2 per 30 seconds", "10 per 10 minutes",
                            "100/20 seconds"],
    "ANIMEGAN_STORAGE_URI": ["memory://", "redis://localhost:6379/0", "rediss://:pw@cache:6380/1",
                             "unix:///run/redis.sock"],
    # empty, as from an empty environment variable: unset
    "ANIMEGAN_RATELIMIT_STORAGE_URI": ["", "memory://", "redis://localhost:6379/1",
                                       "redis+unix:///run/redis.sock"],
    "ANIMEGAN_RESULT_STORAGE_URI": ["", "memory://", "redis://localhost:6380/0",
                                    "unix:///run/redis-state.sock"],
    "ANIMEGAN_URL_PREFIX": ["/", "/anime", "/tools/anime", "/tools/anime/", "/a-b_c.d~e"],
    "ANIMEGAN_WEIGHTS_BASE_URL": ["", "http://127.0.0.1:8080/weights", "https://mirror.example"],
    "ANIMEGAN_EXTRA_STYLES": [{"mine": {"url": "https://x/mine.pt", "sha1": "0" * 40,
                                        "licence": "CC-BY", "face": True}}],
    "ANIMEGAN_PAGE_DECORATORS": [["flask_login.login_required"], ["site.auth:members", "a.b"]],
    "ANIMEGAN_API_DECORATORS": [["flask_login.login_required"]],
    "ANIMEGAN_ADMIN_CHECK": ["site.auth.is_admin", "site.auth:is_admin"],
}
#: Settings that need another one to make a valid example valid (rules between settings).
COMPANIONS: dict[str, dict[str, Any]] = {
    "ANIMEGAN_PHASH_MAX_DISTANCE": {"ANIMEGAN_PHASH_SIZE": 64},
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
             for s in SETTINGS for raw in environment_strings(s)]


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
    with pytest.raises(SettingError, match=f"environment variable {key}=") as error:
        from_environ({key: raw})
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
               "ANIMEGAN_DECODE_TIMEOUT": "2.5", "ANIMEGAN_RATE_LIMIT": "10 per minute",
               "ANIMEGAN_EXTRA_STYLES": '{"mine": {"url": "https://x/m.pt", "sha1": "%s"}}'
                                        % ("a" * 40)}
    app = build(tmp_path, **from_environ(environ))
    settings = app.extensions["animegan"].settings
    assert (settings.max_side, settings.csrf, settings.torch_threads) == (384, False, None)
    assert settings.decode_timeout == 2.5 and settings.rate_limit == "10 per minute"


@pytest.mark.parametrize("config,key", [
    ({"ANIMEGAN_PHASH_SIZE": 4, "ANIMEGAN_PHASH_MAX_DISTANCE": 17}, "ANIMEGAN_PHASH_MAX_DISTANCE"),
    ({"ANIMEGAN_CONTENT_BLOCK": "content"}, "ANIMEGAN_CONTENT_BLOCK"),
    ({"ANIMEGAN_MAX_SIDE": 512, "ANIMEGAN_MAX_OUTPUT_SIDE": 384}, "ANIMEGAN_MAX_OUTPUT_SIDE"),
])
def test_rules_between_settings_are_checked_at_start(tmp_path, config, key):
    with pytest.raises(RuntimeError, match=key):
        build(tmp_path, **config)


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


def test_a_storage_flask_limiter_cannot_count_in_is_refused_at_start(tmp_path):
    # our storage takes unix://, flask-limiter wants redis+unix://: say which key to set
    with pytest.raises(RuntimeError, match="ANIMEGAN_RATELIMIT_STORAGE_URI"):
        build(tmp_path, ANIMEGAN_STORAGE_URI="unix:///nowhere/redis.sock")
    with pytest.raises(RuntimeError, match="ANIMEGAN_RATELIMIT_STORAGE_URI"):
        build(tmp_path, ANIMEGAN_RATELIMIT_STORAGE_URI="nosuchstore://x")


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
