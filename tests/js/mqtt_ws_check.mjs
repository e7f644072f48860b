// MQTT.js, unmodified, against Canopy's MQTT over WebSocket (/mqtt), run by
// tests/it/js.rs. Usage: node mqtt_ws_check.mjs ws://HOST:PORT/mqtt PROTOCOL_VERSION
// It subscribes to `devices/+/temp`, prints `ready` once subscribed, waits for the
// native publish the Rust side then sends (`devices.42.temp` = "21.5"), publishes
// `browser/out` = "from mqtt.js" at QoS 1, and prints `all checks passed`.
import mqtt from "mqtt";

const [url, version] = process.argv.slice(2);
const fail = (why) => {
  console.error(`FAIL: ${why}`);
  process.exit(1);
};
setTimeout(() => fail("timed out"), 20000).unref();

const client = mqtt.connect(url, {
  protocolVersion: Number(version),
  clientId: `mqttjs-${version}`,
  reconnectPeriod: 0,
});
client.on("error", (error) => fail(`client error: ${error.message}`));
client.on("connect", () => {
  client.subscribe("devices/+/temp", { qos: 1 }, (error, granted) => {
    if (error) fail(`subscribe: ${error.message}`);
    if (granted[0].qos !== 1) fail(`granted ${JSON.stringify(granted)}`);
    console.log("ready");
  });
});
client.on("message", (topic, payload) => {
  if (topic !== "devices/42/temp" || payload.toString() !== "21.5") {
    fail(`unexpected message ${topic} ${payload}`);
  }
  client.publish("browser/out", "from mqtt.js", { qos: 1 }, (error) => {
    if (error) fail(`publish: ${error.message}`);
    client.end(false, () => {
      console.log("all checks passed");
      process.exit(0);
    });
  });
});
