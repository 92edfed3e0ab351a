"""Keys at rest are digests, never keys; a presented key finds its entry and limits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.gateway.api_keys import KeyLimits, hash_key, load_key_ring, read_keys_file
from services.gateway.keygen import main as keygen

DEFAULTS = KeyLimits(requests_per_minute=100, tokens_per_minute=0, max_concurrent=4)


def test_a_key_made_by_keygen_is_found_by_its_digest_alone(tmp_path, capsys):
    keygen(["team-a", "--requests-per-minute", "7", "--models", "m1", "m2"])
    printed = capsys.readouterr().out
    key = printed.split("shown once; give it to the client): ", 1)[1].split()[0]
    stanza = printed.split("\n", 1)[1]
    assert key not in stanza  # only the digest goes to the file
    path = tmp_path / "keys.toml"
    path.write_text(stanza)
    ring = load_key_ring([], str(path), DEFAULTS)
    found = ring.find(key)
    assert found is not None and found.name == "team-a"
    assert found.limits == KeyLimits(7, 0, 4)  # its own rpm; the defaults fill the rest
    assert found.may_use("m2") and not found.may_use("m3")
    assert ring.find(key + "x") is None and ring.find("") is None


def test_env_keys_are_hashed_and_distinct_tenants():
    ring = load_key_ring(["alpha", "beta"], None, DEFAULTS)
    alpha, beta = ring.find("alpha"), ring.find("beta")
    assert alpha and beta and alpha.tenant != beta.tenant
    assert "alpha" not in alpha.tenant and alpha.digest == hash_key("alpha")
    assert alpha.limits == DEFAULTS and alpha.may_use("anything")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[[keys]]\nname = "x"\nsha256 = "sk-plain-key"\n', "64 hex digits"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\nrpm = 3\n', "unknown fields"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\nmax_concurrent = -1\n', "non-negative"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\nmodels = "m1"\n', "array of model names"),
        ("[[keys]\n", "keys.toml"),
    ],
)
def test_a_bad_keys_file_names_the_entry_and_the_problem(tmp_path, text, complaint):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint):
        read_keys_file(path, DEFAULTS)


def test_the_same_key_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        load_key_ring(["same", "same"], None, DEFAULTS)


def test_the_gateway_refuses_to_start_on_a_bad_keys_file(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nsha256 = "not-a-digest"\n')
    result = subprocess.run(
        [sys.executable, "-m", "services.gateway", "--api-keys-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "sha256 must be 64 hex digits" in result.stderr


def test_max_priority_defaults_to_0_and_is_checked(tmp_path):
    path = tmp_path / "keys.toml"
    stanza = '[[keys]]\nname = "{}"\nsha256 = "{}"\n'
    path.write_text(
        stanza.format("a", hash_key("a")) + stanza.format("b", hash_key("b")) + "max_priority = 5\n"
    )
    ring = load_key_ring(["env"], str(path), DEFAULTS)
    assert [ring.find(k).max_priority for k in ("env", "a", "b")] == [0, 0, 5]
    for bad in ("-1", "true", "2147483648", '"5"'):
        path.write_text(stanza.format("a", hash_key("a")) + f"max_priority = {bad}\n")
        with pytest.raises(ValueError, match="max_priority"):
            read_keys_file(path, DEFAULTS)
