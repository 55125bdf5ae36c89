"""Pure-Python install of the heisd_ros library and tools (``pip install -e .``).

The ROS 2 package (interfaces, nodes, launch files) is built with colcon from
``package.xml``/``CMakeLists.txt``; this file serves machines without ROS, e.g. a GPU server
running the offline tools. Extras pull the heavy parts only where they are needed.
"""

from setuptools import find_packages, setup

EXTRAS = {
    "model": ["torch>=2.4", "transformers>=4.46,<6", "safetensors>=0.4"],
    "openvla": ["timm>=1.0"],
    "sim": ["mujoco>=3.2", "opencv-python-headless>=4.9"],
    "retrieval": ["qdrant-client>=1.12", "qdrant-edge-py>=0.9"],
    "robot": ["piper-sdk>=0.6.2", "python-can>=4.4"],
    "data": ["rosbags>=0.10"],
    "report": ["matplotlib>=3.8"],
    "view": ["rerun-sdk==0.41.0; python_version >= '3.11'"],
    "test": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "ruff>=0.6",
             "yourdfpy>=0.0.56", "playwright>=1.50"],
}
EXTRAS["all"] = sorted({req for name, reqs in EXTRAS.items() if name != "test" for req in reqs})

TOOLS = ["train-drafter", "bench", "collect", "bringup", "build-db", "calibrate", "train-vla",
         "eval", "record", "replay", "model", "demo", "view"]

setup(
    name="heisd_ros",
    version="0.1.0",
    description="Hybrid speculative decoding with kinematic awareness for VLA robot policies",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["heisd_ros", "heisd_ros.*"]),
    package_data={"heisd_ros": ["assets/**/*", "sim/assets/**/*", "latency/profiles/*.yaml"]},
    install_requires=["numpy>=1.24", "pyyaml>=6", "tqdm>=4.66", "rich>=13"],
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            f"heisd-{tool} = heisd_ros.tools.{tool.replace('-', '_')}:main" for tool in TOOLS
        ],
    },
)
