"""The members of a run's ensemble: which policies sample its groups, each with its own sampling settings.

A run is driven by one policy or by several (`evolve run --policy A --policy B`, `[[search.policies]]` in
`problem.toml`, `build_search(..., policies=[...])`). A member is a policy spec (`embedded`, `vllm:URL`,
`replay:FILE`, ...) with an optional prior weight and its own temperature, top-p, prompt template and edit
format; what it leaves out comes from the run's options. Its name is what the archive records with each group it
sampled and with each policy version it trained, and what a resume matches members by (so reordering them
changes nothing). On the command line the settings follow the spec in brackets:
`embedded[temperature=1.1,template=standard,weight=2,name=hot]`.

Where a member came from matters for one thing: the API key. A member named by the problem folder
(`[[search.policies]]`, `from_problem`) is a server the user did not choose, so it is sent no key from the
environment unless the run says so (`RunOptions.trust_problem_urls`, resolved into `env_key`); a member
given on the command line or through `build_search` is the user's own and gets it as always.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, get_args

from evolve.problem.config import MEMBER_IDENTITY, PolicyMemberSection, member_setting_error

# What makes a member sample differently: `[[search.policies]]`'s keys (evolve/problem/config.py) but its identity
SAMPLING_KEYS = tuple(k for k in PolicyMemberSection.model_fields if k not in MEMBER_IDENTITY)
NUMBER_KEYS = tuple(  # what `--policy SPEC[key=value]` reads as a number
    k for k, f in PolicyMemberSection.model_fields.items() if float in (f.annotation, *get_args(f.annotation))
)
COMMAND_LINE_KEYS = ("name", "weight", *SAMPLING_KEYS)  # what `--policy SPEC[key=value,...]` may set


class MemberError(ValueError):
    """A member spec or table is malformed; `str()` says which and how to fix it."""


@dataclass(frozen=True)
class MemberSpec:
    spec: str  # the policy spec, as `--policy` takes it
    name: str = ""  # unique in the run; default: the spec with its sampling settings
    weight: float = 1.0  # prior value per unit of cost (the bandit's prior), or the share under `weights`
    temperature: float | None = None
    top_p: float | None = None
    template: str | None = None  # standard | directed
    edit_format: str | None = None  # auto | diff | full
    # Named by the problem folder rather than by the user (stored with the run; not part of the member's identity).
    from_problem: bool = field(default=False, compare=False)
    # Whether its server may be sent the API key from the environment: what `RunOptions.members` resolved for
    # this session from `from_problem` and the run's options; never stored.
    env_key: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if not self.spec:
            raise MemberError("a policy member needs a spec, e.g. embedded or replay:FILE")
        for key in ("weight", *SAMPLING_KEYS):  # bounds and choices as `[[search.policies]]` declares them
            said = member_setting_error(key, getattr(self, key))
            if said:
                raise MemberError(f"member {self.spec}: {said}")
        if not self.name:
            object.__setattr__(self, "name", self.default_name())

    def default_name(self) -> str:
        settings = ",".join(f"{k}={getattr(self, k)}" for k in SAMPLING_KEYS if getattr(self, k) is not None)
        return f"{self.spec}[{settings}]" if settings else self.spec

    def as_dict(self) -> dict[str, Any]:
        """What the run stores: the fields that are set (so that older and newer engines read it alike)."""
        # defaults, so that a plain spec stores as {spec}; env_key is the session's, worked out again on resume
        left_out = {"weight": 1.0, "name": self.default_name(), "from_problem": False}
        stored = {k: v for k, v in asdict(self).items() if k != "env_key"}
        return {k: v for k, v in stored.items() if v is not None and left_out.get(k) != v}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> MemberSpec:
        known = {f.name for f in fields(cls)} - {"env_key"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise MemberError(f"policy member {dict(raw)}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise MemberError(f"policy member {dict(raw)}: {exc}") from None


def parse_member(text: str) -> MemberSpec:
    """`SPEC` or `SPEC[key=value,...]` (keys: name, weight, temperature, top_p, template, edit_format)."""
    text = text.strip()
    if not (text.endswith("]") and "[" in text and "=" in text.rsplit("[", 1)[1]):
        return MemberSpec(text)
    spec, _, settings = text[:-1].rpartition("[")
    raw: dict[str, Any] = {}
    for item in settings.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise MemberError(f"--policy {text}: write settings as [key=value,...], got {item!r}")
        if key not in COMMAND_LINE_KEYS:
            raise MemberError(f"--policy {text}: unknown key {key!r}; known: {', '.join(COMMAND_LINE_KEYS)}")
        raw[key] = _typed(text, key, value.strip())
    return MemberSpec.from_dict({"spec": spec, **raw})


def _typed(text: str, key: str, value: str) -> Any:
    if key in NUMBER_KEYS:
        try:
            return float(value)
        except ValueError:
            raise MemberError(f"--policy {text}: {key}={value!r} is not a number") from None
    return value


def check_unique(members: Sequence[MemberSpec]) -> list[MemberSpec]:
    """Members by name; two of one name (the same spec and settings twice) would share one record."""
    seen: set[str] = set()
    for m in members:
        if m.name in seen:
            raise MemberError(f"two policy members are named {m.name!r}; give one of them name=... or other settings")
        seen.add(m.name)
    return list(members)


def members_from(policy: str, policies: Iterable[Mapping[str, Any]]) -> list[MemberSpec]:
    """A run's members from its options: the `policies` list, or the one `policy` when that list is empty."""
    listed = [MemberSpec.from_dict(p) for p in policies]
    return check_unique(listed or [parse_member(policy)])


def as_stored(members: Iterable[str | MemberSpec | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Members given as `--policy` texts, specs or tables, as a run stores them (checked: unique names)."""
    specs = [
        m if isinstance(m, MemberSpec) else parse_member(m) if isinstance(m, str) else MemberSpec.from_dict(m)
        for m in members
    ]
    return [m.as_dict() for m in check_unique(specs)]


def as_options(members: Iterable[str | MemberSpec | Mapping[str, Any]]) -> dict[str, Any]:
    """The run options that name these members: `policy` (the first one's spec) and `policies` (empty for one
    plain spec, so that a one-policy run is stored as it always was)."""
    stored = as_stored(members)
    if not stored:
        raise MemberError("no policy given; give at least one --policy")
    return {"policy": stored[0]["spec"], "policies": [] if stored == [{"spec": stored[0]["spec"]}] else stored}
