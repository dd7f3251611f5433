"""baton's built-in models, data sets and tasks, by the names ``builtin:NAME`` targets use."""
from baton.workers.training.builtins.data import diabetes, digits, spiral
from baton.workers.training.builtins.gpt import char_transformer
from baton.workers.training.builtins.models import cnn, mlp
from baton.workers.training.builtins.tasks import Classification, LanguageModel, Regression
from baton.workers.training.builtins.text import stdlib_text

MODELS = {"mlp": mlp, "cnn": cnn, "char_transformer": char_transformer}
DATA = {"spiral": spiral, "digits": digits, "diabetes": diabetes, "stdlib_text": stdlib_text}
TASKS = {"classification": Classification, "regression": Regression, "language_model": LanguageModel}
