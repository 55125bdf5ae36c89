"""The task suites, LIBERO-style, and a registry by name.

- ``piper_spatial``: the same objects (two identical red blocks and a plate) in a different
  layout per task; the instruction names the block by its spatial relation.
- ``piper_object``: the same skill (put X in the basket) for a different object per task.
- ``piper_goal``: one scene, a different goal per task.
- ``piper_long``: two-stage tasks; both goals must hold at the end.
- ``piper_dynamic``: a conveyor belt moves things on its own, with world time: a slow policy
  loses its chance, not only time (the block leaves the reachable area).

Coordinates are the arm's base frame: x away from the robot, y to its left (m).
"""

from __future__ import annotations

from heisd_ros.sim.conveyor import ConveyorSpec
from heisd_ros.sim.objects import FixtureSpec, ObjectSpec
from heisd_ros.sim.tasks import Goal, TaskSpec, jittered_layout, shuffled_layout

RED, BLUE = (0.85, 0.12, 0.1, 1), (0.12, 0.3, 0.85, 1)
GREEN, YELLOW = (0.1, 0.65, 0.2, 1), (0.95, 0.8, 0.1, 1)
PLATE = FixtureSpec("plate", "plate", 0.07, (0.93, 0.93, 0.9, 1))
BASKET = FixtureSpec("basket", "basket", 0.065, (0.55, 0.38, 0.2, 1), wall_height_m=0.05)


def _block(name: str, rgba, half_m: float = 0.02) -> ObjectSpec:
    return ObjectSpec(name, "box", (half_m, half_m, half_m), rgba, mass_kg=0.05)


RED_BLOCK, BLUE_BLOCK = _block("red_block", RED), _block("blue_block", BLUE)
YELLOW_BLOCK = _block("yellow_block", YELLOW, 0.024)
GREEN_CAN = ObjectSpec("green_can", "cylinder", (0.02, 0.035), GREEN, mass_kg=0.06,
                       grasp_symmetry_rad=0.0)
# Narrow along x (3 cm, the grasp direction), long along y (9 cm).
BLUE_BAR = ObjectSpec("blue_bar", "box", (0.015, 0.045, 0.015), BLUE, mass_kg=0.05,
                      grasp_symmetry_rad=3.141592653589793)


def _spatial() -> list[TaskSpec]:
    objects = (_block("block_a", RED), _block("block_b", RED))
    # task -> (relation phrase, plate, block_a = the target, block_b = the distractor)
    layouts = {
        "block_left_of_plate": ("to the left of the plate",
                                (0.30, -0.06), (0.30, 0.10), (0.20, -0.21)),
        "block_right_of_plate": ("to the right of the plate",
                                 (0.30, 0.08), (0.30, -0.08), (0.42, 0.22)),
        "block_closest_to_robot": ("closest to the robot",
                                   (0.38, 0.12), (0.20, -0.02), (0.40, -0.14)),
        "block_behind_plate": ("behind the plate", (0.24, -0.04), (0.40, -0.04), (0.24, 0.17)),
    }
    return [TaskSpec(
        name=name, suite="piper_spatial",
        instruction=f"pick up the red block {phrase} and place it on the plate",
        objects=objects, fixtures=(PLATE,),
        layout=jittered_layout({"plate": plate, "block_a": a, "block_b": b}, jitter_m=0.015,
                               fixed_yaw={"plate": 0.0}),
        goals=(Goal("block_a", "on", "plate"),), max_steps=220)
        for name, (phrase, plate, a, b) in layouts.items()]


def _object() -> list[TaskSpec]:
    objects = (RED_BLOCK, GREEN_CAN, BLUE_BAR, YELLOW_BLOCK)
    layout = shuffled_layout(((0.18, -0.02), (0.31, -0.06), (0.44, -0.03), (0.22, -0.19),
                              (0.37, -0.21)), tuple(o.name for o in objects),
                             {"basket": (0.30, 0.18)}, jitter_m=0.015,
                             facing_yaw={"blue_bar": 3.141592653589793 / 2})
    phrases = {"red_block": "red block", "green_can": "green can", "blue_bar": "blue bar",
               "yellow_block": "yellow block"}
    return [TaskSpec(
        name=f"{obj}_in_basket", suite="piper_object",
        instruction=f"put the {phrase} in the basket", objects=objects, fixtures=(BASKET,),
        layout=layout, goals=(Goal(obj, "in", "basket"),), max_steps=220)
        for obj, phrase in phrases.items()]


def _goal() -> list[TaskSpec]:
    layout = jittered_layout({"red_block": (0.20, -0.06), "blue_block": (0.36, -0.17),
                              "plate": (0.38, 0.03), "basket": (0.20, 0.19)}, jitter_m=0.015,
                             fixed_yaw={"plate": 0.0, "basket": 0.0})
    goals = {
        "red_block_on_plate": ("put the red block on the plate", Goal("red_block", "on", "plate")),
        "blue_block_in_basket": ("put the blue block in the basket",
                                 Goal("blue_block", "in", "basket")),
        "stack_blue_on_red": ("stack the blue block on the red block",
                              Goal("blue_block", "on", "red_block")),
        "red_block_in_basket": ("put the red block in the basket",
                                Goal("red_block", "in", "basket")),
    }
    return [TaskSpec(name=name, suite="piper_goal", instruction=text,
                     objects=(RED_BLOCK, BLUE_BLOCK), fixtures=(PLATE, BASKET), layout=layout,
                     goals=(goal,), max_steps=220)
            for name, (text, goal) in goals.items()]


def _long() -> list[TaskSpec]:
    layout = jittered_layout({"red_block": (0.20, -0.08), "blue_block": (0.34, -0.19),
                              "green_can": (0.44, -0.03), "plate": (0.32, 0.10),
                              "basket": (0.16, 0.25)}, jitter_m=0.012,
                             fixed_yaw={"plate": 0.0, "basket": 0.0})
    tasks = {
        "red_on_plate_and_blue_in_basket": (
            "put the red block on the plate and put the blue block in the basket",
            (Goal("red_block", "on", "plate"), Goal("blue_block", "in", "basket"))),
        "both_blocks_in_basket": (
            "put both the red block and the blue block in the basket",
            (Goal("red_block", "in", "basket"), Goal("blue_block", "in", "basket"))),
        "stack_blue_on_red_and_can_on_plate": (
            "stack the blue block on the red block and put the green can on the plate",
            (Goal("blue_block", "on", "red_block"), Goal("green_can", "on", "plate"))),
    }
    return [TaskSpec(name=name, suite="piper_long", instruction=text,
                     objects=(RED_BLOCK, BLUE_BLOCK, GREEN_CAN), fixtures=(PLATE, BASKET),
                     layout=layout, goals=goals, max_steps=420)
            for name, (text, goals) in tasks.items()]


def _dynamic() -> list[TaskSpec]:
    # One belt along y at x = 0.36 m (reach 0.29-0.43 m), running at 2-4 cm/s; the static
    # receptacles and blocks stand nearer the robot, clear of the belt. Instructions stay
    # within the small VLA's 48-byte cut (max_instruction_bytes), so every word reaches it.
    forward = ConveyorSpec(x_m=0.36, half_width_m=0.07, speed_range_m_per_s=(0.02, 0.04))
    backward = ConveyorSpec(x_m=0.36, half_width_m=0.07, speed_range_m_per_s=(-0.04, -0.02))
    riding_plate = ConveyorSpec(x_m=0.36, half_width_m=0.07, speed_range_m_per_s=(0.02, 0.04),
                                mounted=("plate",))
    return [
        # The block rides in from the right (-y) towards the left edge of reach.
        TaskSpec(name="conveyor_block_on_plate", suite="piper_dynamic",
                 instruction="put the moving red block on the plate",
                 objects=(RED_BLOCK,), fixtures=(PLATE,), conveyor=forward,
                 layout=jittered_layout({"conveyor": (0.36, -0.12), "red_block": (0.36, -0.22),
                                         "plate": (0.17, 0.14)}, jitter_m=0.015,
                                        fixed_yaw={"plate": 0.0, "conveyor": 0.0}),
                 goals=(Goal("red_block", "on", "plate"),), max_steps=200),
        # Two blocks ride in from the left (+y), in either order: the instruction picks one.
        TaskSpec(name="conveyor_blue_block_in_basket", suite="piper_dynamic",
                 instruction="put the moving blue block in the basket",
                 objects=(RED_BLOCK, BLUE_BLOCK), fixtures=(BASKET,), conveyor=backward,
                 layout=shuffled_layout(((0.36, 0.22), (0.36, 0.07)),
                                        ("red_block", "blue_block"),
                                        {"conveyor": (0.36, 0.12), "basket": (0.17, -0.14)},
                                        jitter_m=0.015),
                 goals=(Goal("blue_block", "in", "basket"),), max_steps=200),
        # The plate rides the belt from the right; the block waits on the table.
        TaskSpec(name="block_on_moving_plate", suite="piper_dynamic",
                 instruction="put the red block on the moving plate",
                 objects=(RED_BLOCK,), fixtures=(PLATE,), conveyor=riding_plate,
                 # The mounted plate has no layout entry: it sits on the belt's centre.
                 layout=jittered_layout({"conveyor": (0.36, -0.22), "red_block": (0.20, 0.0)},
                                        jitter_m=0.015, fixed_yaw={"conveyor": 0.0}),
                 goals=(Goal("red_block", "on", "plate"),), max_steps=200),
    ]


_SUITES: dict[str, list[TaskSpec]] = {"piper_spatial": _spatial(), "piper_object": _object(),
                                      "piper_goal": _goal(), "piper_long": _long(),
                                      "piper_dynamic": _dynamic()}


def list_suites() -> list[str]:
    """Names of all suites."""
    return list(_SUITES)


def list_tasks(suite: str) -> list[str]:
    """Task names of ``suite``; ValueError lists the valid suites otherwise."""
    return [t.name for t in _suite(suite)]


def get_task(suite: str, task: str) -> TaskSpec:
    """The task called ``task`` in ``suite``; ValueError lists the valid names otherwise."""
    for spec in _suite(suite):
        if spec.name == task:
            return spec
    raise ValueError(f"task: unknown task {task!r} in suite {suite!r}; valid tasks are "
                     f"{list_tasks(suite)}")


def _suite(suite: str) -> list[TaskSpec]:
    if suite not in _SUITES:
        raise ValueError(f"suite: unknown suite {suite!r}; valid suites are {list_suites()}")
    return _SUITES[suite]
