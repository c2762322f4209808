"""A planner from measured costs: `plan` predicts updates/s and examples/s
per mode, compression and ps count, names the bottleneck, and recommends a
mode and `num_ps` (`keras-psdist plan` on the command line).

Pure Python, no TensorFlow (a `.keras` file is loaded only when given).

costs.py    `Costs`: the calibrated constants, each with its measurement
model.py    the cost model: `Setup` -> `Prediction`, pure functions
wire.py     bytes per worker step of each compression spelling
inputs.py   `plan`'s argument checks; a model's variable sizes
planner.py  `plan`, `Plan`, `Recommendation`: the predictions and the pick
report.py   `str(plan)`: the markdown table
"""

from keras_psdist.planning.costs import Costs
from keras_psdist.planning.model import Prediction
from keras_psdist.planning.planner import Plan, Recommendation, plan

__all__ = ["Costs", "Plan", "Prediction", "Recommendation", "plan"]
