"""NOVA (baaivision/NOVA) text-to-image adapter implementing MARPolicy."""
from margrpo.models.nova.loading import NOVA_LAYOUT, load_nova
from margrpo.models.nova.policy import NOVAPolicy, nova_schedule
from margrpo.models.nova.transformer import NOVATransformer

__all__ = ["NOVA_LAYOUT", "NOVAPolicy", "NOVATransformer", "load_nova", "nova_schedule"]
