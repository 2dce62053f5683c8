// Validates Grafana dashboard JSON files against the JSON Schema generated from the
// `Dashboard` type of npm @grafana/schema (the types Grafana itself is built from).
// Usage: node validate.mjs DASHBOARD.json...   Exit status 1 when any is invalid.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createGenerator } from "ts-json-schema-generator";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const here = path.dirname(fileURLToPath(import.meta.url));
const types = path.join(here, "node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts");
const schema = createGenerator({ path: types, type: "Dashboard", skipTypeCheck: true }).createSchema("Dashboard");
const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);
const validate = ajv.compile(schema);

let failed = false;
for (const file of process.argv.slice(2)) {
  const ok = validate(JSON.parse(fs.readFileSync(file, "utf8")));
  if (ok) {
    console.log(`${file}: valid`);
  } else {
    failed = true;
    console.log(`${file}: INVALID`);
    for (const e of validate.errors) {
      console.log(`  ${e.instancePath || "/"} ${e.message} ${e.params?.additionalProperty ?? ""}`);
    }
  }
}
process.exit(failed ? 1 : 0);
