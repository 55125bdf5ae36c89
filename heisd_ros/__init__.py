"""heisd_ros: hybrid speculative decoding with kinematic awareness for autoregressive VLAs.

The pure-Python library (``heisd_ros.actions``, ``.geometry``, ``.models``, ``.decoding``,
``.retrieval``, ``.kinematics``, ``.latency``, ``.sim``, ``.data``, ``.tools``) imports without
ROS. The ROS 2 layer
(``heisd_ros.nodes``) and the generated interfaces (``heisd_ros.msg``, ``heisd_ros.srv``) exist
only after ``colcon build``.
"""

from pkgutil import extend_path

# The colcon install space holds a second ``heisd_ros`` directory with the generated
# ``msg``/``srv`` modules; extending the package path lets a source checkout (pytest, an
# editable pip install) and the install space serve one package.
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
