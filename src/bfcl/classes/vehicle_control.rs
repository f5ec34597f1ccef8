//! `VehicleControlAPI`: a car's doors, engine, brakes, climate, cruise control and trip
//! helpers.
//!
//! Observed reference behaviour (BFCL trace README, "VehicleControlAPI", and the traces):
//! `remainingUnlockedDoors` is recomputed from `doorStatus` at load and the engine state is
//! read from `engineState`; `startEngine` checks, in order, locked doors (listing the unlocked
//! ones), the brake pedal, a full brake force (`_brakePedalForce == 1000.0`), fuel, and only
//! then the ignition mode; `lockDoors` indexes `doorStatus` with every given door (`KeyError`);
//! `adjustClimateControl` returns the input temperature but stores it in °C;
//! `setCruiseControl` stores the distance before validating the speed; the speed and
//! outside-temperature readings are `uniform` draws from `random.Random(141053)`. With
//! `long_context`, `displayCarStatus`, `check_tire_pressure`, `activateParkingBrake`,
//! `estimate_distance` and `get_outside_temperature_from_google` carry the extension data.

use serde_json::{Map, Value};

use super::long_context::constant;
use super::{cfg, error_dict, snapshot_of, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{arith, compare, py_float, py_iter, ArithOp, CmpOp};
use crate::bfcl::pyrandom::PyRandom;
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};

const CLASS: &str = "VehicleControlAPI";
const METHODS: &[&str] = &[
    "activateParkingBrake",
    "adjustClimateControl",
    "check_tire_pressure",
    "displayCarStatus",
    "display_log",
    "estimate_distance",
    "estimate_drive_feasibility_by_mileage",
    "fillFuelTank",
    "find_nearest_tire_shop",
    "gallon_to_liter",
    "get_current_speed",
    "get_outside_temperature_from_google",
    "get_outside_temperature_from_weather_com",
    "get_zipcode_based_on_city",
    "liter_to_gallon",
    "lockDoors",
    "pressBrakePedal",
    "releaseBrakePedal",
    "setCruiseControl",
    "setHeadlights",
    "set_navigation",
    "startEngine",
];
const DEFAULT_SEED: i64 = 141_053;
const MAX_FUEL_LEVEL: i64 = 50;
const MIN_FUEL_LEVEL: f64 = 0.0;
const MILE_PER_GALLON: f64 = 20.0;

/// Zip codes the reference knows; any other city gets `00000`.
const ZIPCODES: &[(&str, &str)] = &[
    ("Rivermist", "83214"),
    ("Stonebrook", "74532"),
    ("Maplecrest", "56108"),
    ("Silverpine", "62947"),
    ("Shadowridge", "71354"),
    ("Sunset Valley", "29581"),
    ("Oakendale", "47329"),
    ("Willowbend", "32145"),
    ("Crescent Hollow", "69238"),
    ("Autumnville", "51479"),
    ("San Francisco", "94016"),
];

/// Distances (km) between zip codes, either order.
const DISTANCES: &[(&str, &str, f64)] = &[
    ("83214", "74532", 750.0),
    ("56108", "62947", 320.0),
    ("71354", "83214", 450.0),
    ("29581", "62947", 320.0),
    ("69238", "51479", 630.0),
    ("94016", "83214", 980.0),
    ("94016", "74532", 880.0),
    ("94016", "62947", 780.0),
    ("62947", "47329", 1053.0),
];

/// The car's compared state plus its private forces and generator.
#[derive(Debug, Clone)]
pub struct VehicleControlApi {
    fuel_level: PyValue,
    battery_voltage: PyValue,
    engine_state: PyValue,
    remaining_unlocked_doors: PyValue,
    door_status: PyDict,
    ac_temperature: PyValue,
    fan_speed: PyValue,
    ac_mode: PyValue,
    humidity_level: PyValue,
    head_light_status: PyValue,
    parking_brake_status: PyValue,
    brake_pedal_status: PyValue,
    distance_to_next_vehicle: PyValue,
    cruise_status: PyValue,
    destination: PyValue,
    front_left_tire_pressure: PyValue,
    front_right_tire_pressure: PyValue,
    rear_left_tire_pressure: PyValue,
    rear_right_tire_pressure: PyValue,
    long_context: bool,
    brake_pedal_force: PyValue,
    parking_brake_force: PyValue,
    slope_angle: PyValue,
    random: PyRandom,
}

fn default_doors() -> PyDict {
    ["driver", "passenger", "rear_left", "rear_right"]
        .into_iter()
        .map(|d| (PyValue::str(d), PyValue::str("unlocked")))
        .collect()
}

impl VehicleControlApi {
    /// Loads the scenario; missing keys take `DEFAULT_STATE` (empty tank, all doors unlocked).
    pub fn load(config: &PyDict, long_context: bool) -> Self {
        let seed = match config.get_str("random_seed") {
            Some(PyValue::Int(s)) => *s,
            _ => DEFAULT_SEED,
        };
        let door_status = match config.get_str("doorStatus") {
            Some(PyValue::Dict(d)) => d.clone(),
            _ => default_doors(),
        };
        let unlocked = door_status
            .values()
            .filter(|v| v.py_eq(&PyValue::str("unlocked")))
            .count();
        let f = PyValue::Float;
        Self {
            fuel_level: cfg(config, "fuelLevel", f(0.0)),
            battery_voltage: cfg(config, "batteryVoltage", f(12.6)),
            engine_state: cfg(config, "engineState", PyValue::str("stopped")),
            remaining_unlocked_doors: PyValue::Int(unlocked as i64),
            door_status,
            ac_temperature: cfg(config, "acTemperature", f(25.0)),
            fan_speed: cfg(config, "fanSpeed", PyValue::Int(50)),
            ac_mode: cfg(config, "acMode", PyValue::str("auto")),
            humidity_level: cfg(config, "humidityLevel", f(50.0)),
            head_light_status: cfg(config, "headLightStatus", PyValue::str("off")),
            parking_brake_status: cfg(config, "parkingBrakeStatus", PyValue::str("released")),
            brake_pedal_status: cfg(config, "brakePedalStatus", PyValue::str("released")),
            distance_to_next_vehicle: cfg(config, "distanceToNextVehicle", f(50.0)),
            cruise_status: cfg(config, "cruiseStatus", PyValue::str("inactive")),
            destination: cfg(config, "destination", PyValue::str("None")),
            front_left_tire_pressure: cfg(config, "frontLeftTirePressure", f(32.0)),
            front_right_tire_pressure: cfg(config, "frontRightTirePressure", f(32.0)),
            rear_left_tire_pressure: cfg(config, "rearLeftTirePressure", f(30.0)),
            rear_right_tire_pressure: cfg(config, "rearRightTirePressure", f(30.0)),
            long_context,
            brake_pedal_force: cfg(config, "brakePedalForce", f(0.0)),
            parking_brake_force: cfg(config, "parkingBrakeForce", f(0.0)),
            slope_angle: cfg(config, "slopeAngle", f(0.0)),
            random: PyRandom::new(seed),
        }
    }

    fn is(v: &PyValue, s: &str) -> bool {
        v.py_eq(&PyValue::str(s))
    }

    fn lock_doors(&mut self, unlock: &PyValue, door: &PyValue) -> Result<PyValue, PyErr> {
        let (to, step) = if unlock.truthy() {
            ("unlocked", 1)
        } else {
            ("locked", -1)
        };
        for d in py_iter(door)? {
            let current = self
                .door_status
                .get(&d)
                .ok_or_else(|| PyErr::key_error(&d))?;
            if Self::is(current, to) {
                continue;
            }
            self.door_status.insert(d, PyValue::str(to));
            self.remaining_unlocked_doors = arith(
                ArithOp::Add,
                &self.remaining_unlocked_doors,
                &PyValue::Int(step),
            )?;
        }
        Ok(PyValue::dict([
            ("lockStatus", PyValue::str(to)),
            (
                "remainingUnlockedDoors",
                self.remaining_unlocked_doors.clone(),
            ),
        ]))
    }

    fn start_engine(&mut self, mode: &PyValue) -> Result<PyValue, PyErr> {
        if Self::is(mode, "STOP") {
            self.engine_state = PyValue::str("stopped");
        }
        let unlocked: Vec<String> = self
            .door_status
            .iter()
            .filter(|(_, v)| Self::is(v, "unlocked"))
            .map(|(k, _)| k.to_py_str())
            .collect();
        if !unlocked.is_empty() {
            return Ok(error_dict(format!(
                "All doors must be locked before starting the engine. Here are the unlocked doors: {}",
                unlocked.join(", ")
            )));
        }
        if !Self::is(&self.brake_pedal_status, "pressed") {
            return Ok(error_dict(
                "Brake pedal needs to be pressed when starting the engine.",
            ));
        }
        if !self.brake_pedal_force.py_eq(&PyValue::Float(1000.0)) {
            return Ok(error_dict(
                "Must press the brake fully before starting the engine.",
            ));
        }
        if compare(CmpOp::Lt, &self.fuel_level, &PyValue::Float(MIN_FUEL_LEVEL))? {
            return Ok(error_dict("Fuel tank is empty."));
        }
        if !Self::is(mode, "START") {
            return Ok(error_dict("Invalid ignition mode."));
        }
        self.engine_state = PyValue::str("running");
        Ok(PyValue::dict([
            ("engineState", self.engine_state.clone()),
            ("fuelLevel", self.fuel_level.clone()),
            ("batteryVoltage", self.battery_voltage.clone()),
        ]))
    }

    fn display_car_status(&self, option: &PyValue) -> PyValue {
        let mut status = PyDict::new();
        let mut put = |k: &str, v: PyValue| status.insert(PyValue::str(k), v);
        if self.long_context {
            put("metadata", constant("CAR_STATUS_METADATA_EXTENSION"));
        }
        match option.as_str() {
            Some("fuel") => put("fuelLevel", self.fuel_level.clone()),
            Some("battery") => put("batteryVoltage", self.battery_voltage.clone()),
            Some("doors") => put("doorStatus", PyValue::Dict(self.door_status.clone())),
            Some("climate") => {
                put("currentACTemperature", self.ac_temperature.clone());
                put("fanSpeed", self.fan_speed.clone());
                put("climateMode", self.ac_mode.clone());
                put("humidityLevel", self.humidity_level.clone());
            }
            Some("headlights") => put("headlightStatus", self.head_light_status.clone()),
            Some("parkingBrake") => {
                put("parkingBrakeStatus", self.parking_brake_status.clone());
                put("_parkingBrakeForce", self.parking_brake_force.clone());
                put("_slopeAngle", self.slope_angle.clone());
            }
            Some("brakePedal") => {
                put("brakePedalStatus", self.brake_pedal_status.clone());
                put("brakePedalForce", self.brake_pedal_force.clone());
            }
            Some("engine") => put("engineState", self.engine_state.clone()),
            _ => put("error", PyValue::str("Invalid option")),
        }
        PyValue::Dict(status)
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        let one = |k: &str, v: PyValue| Ok(PyValue::dict([(k, v)]));
        match method {
            "lockDoors" => self.lock_doors(&arg(0), &arg(1)),
            "startEngine" => self.start_engine(&arg(0)),
            "fillFuelTank" => {
                let amount = arg(0);
                if compare(CmpOp::Lt, &amount, &PyValue::Int(0))? {
                    return Ok(error_dict("Fuel amount cannot be negative."));
                }
                let total = arith(ArithOp::Add, &amount, &self.fuel_level)?;
                if compare(CmpOp::Gt, &total, &PyValue::Int(MAX_FUEL_LEVEL))? {
                    return Ok(error_dict("Cannot fill gas above the tank capacity."));
                }
                if compare(CmpOp::Lt, &total, &PyValue::Float(MIN_FUEL_LEVEL))? {
                    return Ok(error_dict("Fuel tank is empty."));
                }
                self.fuel_level = arith(ArithOp::Add, &self.fuel_level, &amount)?;
                one("fuelLevel", self.fuel_level.clone())
            }
            "displayCarStatus" => Ok(self.display_car_status(&arg(0))),
            "setHeadlights" => {
                let mode = arg(0);
                if !(Self::is(&mode, "on") || Self::is(&mode, "off")) {
                    return Ok(error_dict("Invalid headlight mode."));
                }
                self.head_light_status = mode.clone();
                one("headlightStatus", mode)
            }
            "activateParkingBrake" => {
                let mode = arg(0);
                let (status, force, slope) = if Self::is(&mode, "engage") {
                    ("engaged", 500.0, 10.0)
                } else if Self::is(&mode, "release") {
                    ("released", 0.0, 0.0)
                } else {
                    return Ok(error_dict("Invalid mode"));
                };
                self.parking_brake_status = PyValue::str(status);
                self.parking_brake_force = PyValue::Float(force);
                self.slope_angle = PyValue::Float(slope);
                let mut out = PyDict::new();
                if self.long_context {
                    out.insert(
                        PyValue::str("parkingBrakeInstruction"),
                        constant("PARKING_BRAKE_INSTRUCTION"),
                    );
                }
                out.insert(PyValue::str("parkingBrakeStatus"), PyValue::str(status));
                out.insert(PyValue::str("_parkingBrakeForce"), PyValue::Float(force));
                out.insert(PyValue::str("_slopeAngle"), PyValue::Float(slope));
                Ok(PyValue::Dict(out))
            }
            "pressBrakePedal" => {
                let pos = arg(0);
                if !(compare(CmpOp::Le, &PyValue::Int(0), &pos)?
                    && compare(CmpOp::Le, &pos, &PyValue::Int(1))?)
                {
                    return Ok(error_dict("Pedal position must be between 0 and 1."));
                }
                if pos.py_eq(&PyValue::Int(0)) {
                    self.brake_pedal_status = PyValue::str("released");
                    self.brake_pedal_force = PyValue::Float(0.0);
                    return Ok(PyValue::dict([
                        ("brakePedalStatus", PyValue::str("released")),
                        ("brakePedalForce", PyValue::Float(0.0)),
                    ]));
                }
                let force = arith(ArithOp::Mul, &pos, &PyValue::Float(1000.0))?;
                self.brake_pedal_status = PyValue::str("pressed");
                self.brake_pedal_force = force.clone();
                Ok(PyValue::dict([
                    ("brakePedalStatus", PyValue::str("pressed")),
                    ("brakePedalForce", force),
                ]))
            }
            "releaseBrakePedal" => {
                self.brake_pedal_status = PyValue::str("released");
                self.brake_pedal_force = PyValue::Float(0.0);
                Ok(PyValue::dict([
                    ("brakePedalStatus", PyValue::str("released")),
                    ("brakePedalForce", PyValue::Float(0.0)),
                ]))
            }
            "setCruiseControl" => {
                if Self::is(&self.engine_state, "stopped") {
                    return Ok(error_dict(
                        "Start the engine before activating the cruise control.",
                    ));
                }
                let speed = py_float(&arg(0))?;
                let distance = py_float(&arg(2))?;
                if arg(1).truthy() {
                    self.distance_to_next_vehicle = PyValue::Float(distance);
                    if !(0.0..=120.0).contains(&speed) || speed % 5.0 != 0.0 {
                        return Ok(error_dict("Invalid speed"));
                    }
                    self.cruise_status = PyValue::str("active");
                } else {
                    self.cruise_status = PyValue::str("inactive");
                    self.distance_to_next_vehicle = PyValue::Float(distance);
                }
                Ok(PyValue::dict([
                    ("cruiseStatus", self.cruise_status.clone()),
                    ("currentSpeed", PyValue::Float(speed)),
                    ("distanceToNextVehicle", PyValue::Float(distance)),
                ]))
            }
            "get_current_speed" => one(
                "currentSpeed",
                PyValue::Float(self.random.uniform(0.0, 120.0)),
            ),
            "display_log" => one("log", arg(0)),
            "estimate_drive_feasibility_by_mileage" => {
                let range = arith(
                    ArithOp::Mul,
                    &self.fuel_level,
                    &PyValue::Float(MILE_PER_GALLON),
                )?;
                let short = compare(CmpOp::Lt, &range, &arg(0))?;
                one("canDrive", PyValue::Bool(!short))
            }
            "liter_to_gallon" => one(
                "gallon",
                arith(ArithOp::Mul, &arg(0), &PyValue::Float(0.264172))?,
            ),
            "gallon_to_liter" => one(
                "liter",
                arith(ArithOp::Mul, &arg(0), &PyValue::Float(3.78541))?,
            ),
            "estimate_distance" => {
                let (a_city, b_city) = (arg(0), arg(1));
                let found = DISTANCES.iter().find(|(x, y, _)| {
                    (Self::is(&a_city, x) && Self::is(&b_city, y))
                        || (Self::is(&a_city, y) && Self::is(&b_city, x))
                });
                let mut out = match found {
                    Some((_, _, d)) => PyValue::dict([("distance", PyValue::Float(*d))]),
                    None => error_dict("distance not found in database."),
                };
                if self.long_context {
                    if let PyValue::Dict(d) = &mut out {
                        d.insert(
                            PyValue::str("intermediaryCities"),
                            constant("INTERMEDIARY_CITIES"),
                        );
                    }
                }
                Ok(out)
            }
            "get_zipcode_based_on_city" => {
                let city = arg(0);
                let zip = ZIPCODES
                    .iter()
                    .find(|(c, _)| Self::is(&city, c))
                    .map_or("00000", |(_, z)| z);
                one("zipcode", PyValue::str(zip))
            }
            "set_navigation" => {
                let destination = arg(0);
                self.destination = destination.clone();
                let text = arith(ArithOp::Add, &PyValue::str("Navigating to "), &destination)?;
                one("status", text)
            }
            "check_tire_pressure" => {
                let pressures = [
                    &self.front_left_tire_pressure,
                    &self.front_right_tire_pressure,
                    &self.rear_left_tire_pressure,
                    &self.rear_right_tire_pressure,
                ];
                let mut sum = PyValue::Int(0);
                for p in pressures {
                    sum = arith(ArithOp::Add, &sum, p)?;
                }
                let mean = arith(ArithOp::Div, &sum, &PyValue::Int(4))?;
                let healthy = compare(CmpOp::Le, &PyValue::Int(30), &mean)?
                    && compare(CmpOp::Le, &mean, &PyValue::Int(35))?;
                let car_info = if self.long_context {
                    constant("CAR_STATUS_METADATA_EXTENSION")
                } else {
                    PyValue::Dict(PyDict::new())
                };
                Ok(PyValue::dict([
                    ("frontLeftTirePressure", pressures[0].clone()),
                    ("frontRightTirePressure", pressures[1].clone()),
                    ("rearLeftTirePressure", pressures[2].clone()),
                    ("rearRightTirePressure", pressures[3].clone()),
                    ("healthy_tire_pressure", PyValue::Bool(healthy)),
                    ("car_info", car_info),
                ]))
            }
            "find_nearest_tire_shop" => one(
                "shopLocation",
                PyValue::str("456 Oakwood Avenue, Rivermist, 83214"),
            ),
            "get_outside_temperature_from_google" => {
                let t = PyValue::Float(self.random.uniform(-10.0, 40.0));
                if self.long_context {
                    let mut weather = match constant("LONG_WEATHER_EXTENSION") {
                        PyValue::Dict(d) => d,
                        _ => PyDict::new(),
                    };
                    weather.insert(PyValue::str("outsideTemperature"), t);
                    return Ok(PyValue::Dict(weather));
                }
                one("outsideTemperature", t)
            }
            "get_outside_temperature_from_weather_com" => one("error", PyValue::Int(404)),
            "adjustClimateControl" => {
                let temperature = arg(0);
                let unit = a[1].clone().unwrap_or(PyValue::str("celsius"));
                let fan = a[2].clone().unwrap_or(PyValue::Int(50));
                let mode = a[3].clone().unwrap_or(PyValue::str("auto"));
                if !(compare(CmpOp::Le, &PyValue::Int(0), &fan)?
                    && compare(CmpOp::Le, &fan, &PyValue::Int(100))?)
                {
                    return Ok(error_dict("Fan speed must be between 0 and 100."));
                }
                self.ac_temperature = if Self::is(&unit, "fahrenheit") {
                    let c = arith(ArithOp::Sub, &temperature, &PyValue::Int(32))?;
                    let c = arith(ArithOp::Mul, &c, &PyValue::Int(5))?;
                    arith(ArithOp::Div, &c, &PyValue::Int(9))?
                } else {
                    temperature.clone()
                };
                self.fan_speed = fan;
                self.ac_mode = mode.clone();
                Ok(PyValue::dict([
                    ("currentACTemperature", temperature),
                    ("climateMode", mode),
                    ("humidityLevel", self.humidity_level.clone()),
                ]))
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const CLIMATE: [Param; 4] = [
        req("temperature"),
        opt("unit"),
        opt("fanSpeed"),
        opt("mode"),
    ];
    const CRUISE: [Param; 3] = [req("speed"), req("activate"), req("distanceToNextVehicle")];
    const LOCK: [Param; 2] = [req("unlock"), req("door")];
    const CITIES: [Param; 2] = [req("cityA"), req("cityB")];
    match method {
        "activateParkingBrake" | "setHeadlights" => {
            const P: &[Param] = &[req("mode")];
            P
        }
        "adjustClimateControl" => &CLIMATE,
        "displayCarStatus" => {
            const P: &[Param] = &[req("option")];
            P
        }
        "display_log" => {
            const P: &[Param] = &[req("messages")];
            P
        }
        "estimate_distance" => &CITIES,
        "estimate_drive_feasibility_by_mileage" => {
            const P: &[Param] = &[req("distance")];
            P
        }
        "fillFuelTank" => {
            const P: &[Param] = &[req("fuelAmount")];
            P
        }
        "gallon_to_liter" => {
            const P: &[Param] = &[req("gallon")];
            P
        }
        "get_zipcode_based_on_city" => {
            const P: &[Param] = &[req("city")];
            P
        }
        "liter_to_gallon" => {
            const P: &[Param] = &[req("liter")];
            P
        }
        "lockDoors" => &LOCK,
        "pressBrakePedal" => {
            const P: &[Param] = &[req("pedalPosition")];
            P
        }
        "setCruiseControl" => &CRUISE,
        "set_navigation" => {
            const P: &[Param] = &[req("destination")];
            P
        }
        "startEngine" => {
            const P: &[Param] = &[req("ignitionMode")];
            P
        }
        _ => &[],
    }
}

impl PythonClass for VehicleControlApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        let doors = PyValue::Dict(self.door_status.clone());
        let long_context = PyValue::Bool(self.long_context);
        snapshot_of(&[
            ("fuelLevel", &self.fuel_level),
            ("batteryVoltage", &self.battery_voltage),
            ("engine_state", &self.engine_state),
            ("remainingUnlockedDoors", &self.remaining_unlocked_doors),
            ("doorStatus", &doors),
            ("acTemperature", &self.ac_temperature),
            ("fanSpeed", &self.fan_speed),
            ("acMode", &self.ac_mode),
            ("humidityLevel", &self.humidity_level),
            ("headLightStatus", &self.head_light_status),
            ("parkingBrakeStatus", &self.parking_brake_status),
            ("brakePedalStatus", &self.brake_pedal_status),
            ("distanceToNextVehicle", &self.distance_to_next_vehicle),
            ("cruiseStatus", &self.cruise_status),
            ("destination", &self.destination),
            ("frontLeftTirePressure", &self.front_left_tire_pressure),
            ("frontRightTirePressure", &self.front_right_tire_pressure),
            ("rearLeftTirePressure", &self.rear_left_tire_pressure),
            ("rearRightTirePressure", &self.rear_right_tire_pressure),
            ("long_context", &long_context),
        ])
    }
}
