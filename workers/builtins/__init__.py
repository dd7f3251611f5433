"""baton's built-in models and data sets, by the names ``builtin:NAME`` targets use."""
from .data import digits, spiral
from .models import cnn, mlp

MODELS = {"mlp": mlp, "cnn": cnn}
DATA = {"spiral": spiral, "digits": digits}
