"""baton's built-in models, data sets and tasks, by the names ``builtin:NAME`` targets use."""
from .data import diabetes, digits, spiral
from .gpt import char_transformer
from .models import cnn, mlp
from .tasks import Classification, LanguageModel, Regression
from .text import stdlib_text

MODELS = {"mlp": mlp, "cnn": cnn, "char_transformer": char_transformer}
DATA = {"spiral": spiral, "digits": digits, "diabetes": diabetes, "stdlib_text": stdlib_text}
TASKS = {"classification": Classification, "regression": Regression, "language_model": LanguageModel}
