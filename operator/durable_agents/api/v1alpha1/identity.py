"""Who did something, as the API server authenticated them, and the operator's stamp field."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from durable_agents.api.v1alpha1.meta import ApiModel


class Identity(ApiModel):
    """Who did something, as the API server authenticated them (stamped by the admission webhook)."""

    username: str = Field(max_length=253)
    """The user's name, as the API server authenticated it."""
    groups: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=32)
    """The user's groups, as the API server authenticated them."""
    uid: str | None = Field(default=None, max_length=128)
    """The user's UID, when the authenticator gives one."""

    def who(self) -> Identity:
        """Just the identity (without a subclass's stamp): what stamps cover."""
        return Identity(username=self.username, groups=list(self.groups), uid=self.uid)


# An operator stamp, ``<key ID>:<base64 MAC>`` (durable_agents.core.stamps); only the operator's
# admission webhook makes one, so a copied or hand-written value never verifies for other fields.
def stamp_field() -> Any:
    return Field(
        default=None,
        max_length=512,
        pattern=r"^[^:]+:[A-Za-z0-9+/=]+$",
        description=(
            "The operator's stamp (<key ID>:<base64 MAC>) over this entry, written by its admission "
            "webhook: the operator acts only on an entry whose stamp verifies."
        ),
    )
