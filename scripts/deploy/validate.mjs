// Validates the deployment files under deploy/ offline (no cluster):
//   1. every YAML document parses, and is checked against its schema:
//      Kubernetes core/apps objects against the kubernetes-models package's
//      schemas, KServe's ServingRuntime and InferenceService against the
//      JSON Schemas in deploy/schemas (no package ships KServe's), with the
//      containers inside them checked as Kubernetes Containers;
//   2. the rules the server's behaviour depends on (project checks): probes
//      on /v2/health/ready and /v2/health/live, memory request == limit
//      (and CPU: Guaranteed QoS), --memory auto, a termination grace period
//      longer than the preStop wait plus --grace-ms with a margin, a
//      non-root read-only container, the models mounted read-only, KServe's
//      names (kserve-container, http1, v2, onnx) and cross-references;
//   3. deploy/Containerfile: the base, non-root numeric USER in every image
//      stage, STOPSIGNAL, EXPOSE matching the manifests, the default CMD, no
//      "latest" tags, and every library scripts/setup/deps.sh installs for
//      the build present in the build stage.
// Prints one line per file (and per problem) and exits 1 on any problem.
//
//   node scripts/deploy/validate.mjs [--root DIR] [--modules DIR] [--self-test]
// --root: the project folder (default: this script's ../..); --modules: the
// node_modules with kubernetes-models, yaml and ajv (default
// ROOT/.cache/deploy-check/node_modules). --self-test: after the real
// check, breaks the parsed files in memory, one known way at a time, and
// fails unless the checks reject every broken copy (and accept the intact
// one), so a check that silently stopped working is noticed.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : dflt;
};
const root = path.resolve(opt("--root", path.join(here, "..", "..")));
const modules = path.resolve(opt("--modules", path.join(root, ".cache", "deploy-check", "node_modules")));
const selfTest = argv.includes("--self-test");

const load = (spec) => import(pathToFileURL(path.join(modules, spec)).href);
let YAML, Ajv, K;
try {
  YAML = await load("yaml/dist/index.js");
  Ajv = (await load("ajv/dist/ajv.js")).default;
  K = {
    Deployment: (await load("kubernetes-models/apps/v1/Deployment.js")).Deployment,
    Service: (await load("kubernetes-models/v1/Service.js")).Service,
    ConfigMap: (await load("kubernetes-models/v1/ConfigMap.js")).ConfigMap,
    PersistentVolumeClaim: (await load("kubernetes-models/v1/PersistentVolumeClaim.js")).PersistentVolumeClaim,
    Container: (await load("kubernetes-models/v1/Container.js")).Container,
  };
} catch (e) {
  console.error(`validate: cannot load the packages from ${modules} (run scripts/deploy-check.sh): ${e.message}`);
  process.exit(2);
}

// The objects this project deploys: (apiVersion, kind) -> how to check it.
const CORE = {
  "apps/v1 Deployment": K.Deployment,
  "v1 Service": K.Service,
  "v1 ConfigMap": K.ConfigMap,
  "v1 PersistentVolumeClaim": K.PersistentVolumeClaim,
};
const ajv = new Ajv({ allErrors: true, strict: true });
const schemaOf = (file) => ajv.compile(JSON.parse(fs.readFileSync(path.join(root, "deploy", "schemas", file), "utf8")));
const KSERVE = {
  "serving.kserve.io/v1alpha1 ServingRuntime": schemaOf("servingruntime.schema.json"),
  "serving.kserve.io/v1alpha1 ClusterServingRuntime": null, // same schema, filled below
  "serving.kserve.io/v1beta1 InferenceService": schemaOf("inferenceservice.schema.json"),
};
KSERVE["serving.kserve.io/v1alpha1 ClusterServingRuntime"] = KSERVE["serving.kserve.io/v1alpha1 ServingRuntime"];

const READY = "/v2/health/ready";
const LIVE = "/v2/health/live";
const GRACE_MS_DEFAULT = 10000; // edgeserve serve's --grace-ms default
const K8S_GRACE_DEFAULT = 30; // Kubernetes' terminationGracePeriodSeconds default
const EXIT_MARGIN_S = 5; // the period must exceed preStop + drain by at least this
// Libraries deps.sh installs for the tests, fuzzing or benchmarks only.
const TEST_ONLY_DEV = new Set(["libcmocka-dev", "libclang-rt-14-dev", "zlib1g-dev"]);

// ---- reading -----------------------------------------------------------------------------

function findManifests(dir) {
  const out = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...findManifests(p));
    else if (/\.ya?ml$/.test(e.name)) out.push(p);
  }
  return out.sort();
}

// { rel, docs: [objects], errors: [] } for one YAML file's text.
function parseFile(rel, text) {
  const f = { rel, docs: [], errors: [] };
  for (const d of YAML.parseAllDocuments(text)) {
    if (d.errors.length) {
      for (const e of d.errors) f.errors.push(`YAML: ${e.message.split("\n")[0]}`);
      continue;
    }
    const o = d.toJS();
    if (o !== null && o !== undefined) f.docs.push(o);
  }
  if (!f.docs.length && !f.errors.length) f.errors.push("no YAML document in the file");
  return f;
}

// ---- quantities and small helpers ----------------------------------------------------------

const SUFFIX = { "": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, m: 1e-3 };
function quantity(q) {
  const m = /^([0-9]+(?:\.[0-9]+)?)(|k|M|G|T|Ki|Mi|Gi|Ti|m)$/.exec(String(q));
  return m ? Number(m[1]) * SUFFIX[m[2]] : NaN;
}
const argAfter = (args, flag) => {
  const i = (args || []).indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
};
const clone = (o) => JSON.parse(JSON.stringify(o));
const where = (doc) => `${doc.kind}/${doc.metadata?.name ?? "?"}`;

// ---- project checks -----------------------------------------------------------------------

// The checks on the server's container. ctx: { podSecurity, graceS, requireStartup,
// kserve } ; returns a list of problems.
function checkServerContainer(c, ctx) {
  const p = [];
  const args = [...(c.command || []), ...(c.args || [])];
  if (args[0] !== "serve" && !args.includes("serve"))
    p.push(`container ${c.name}: args do not run "serve"`);
  if (argAfter(args, "--memory") !== "auto")
    p.push(`container ${c.name}: args must contain "--memory auto" (the budget from the cgroup limit)`);
  if (argAfter(args, "--host") !== "0.0.0.0")
    p.push(`container ${c.name}: args must contain "--host 0.0.0.0" (the default listens on loopback only)`);

  const portNames = new Map((c.ports || []).map((x) => [x.name, x.containerPort]));
  const portNums = new Set((c.ports || []).map((x) => x.containerPort));
  const listen = Number(argAfter(args, "--port") ?? 8000);
  if (!portNums.has(listen)) p.push(`container ${c.name}: --port ${listen} is not among its containerPorts`);
  const probe = (name, paths, required) => {
    const pr = c[name];
    if (!pr) {
      if (required) p.push(`container ${c.name}: no ${name}`);
      return;
    }
    const g = pr.httpGet;
    if (!g) return p.push(`container ${c.name}: ${name} must be an httpGet probe`);
    if (!paths.includes(g.path)) p.push(`container ${c.name}: ${name} path ${g.path} (want ${paths.join(" or ")})`);
    const port = typeof g.port === "string" ? portNames.get(g.port) : g.port;
    if (port !== listen) p.push(`container ${c.name}: ${name} port ${g.port} is not the server's port ${listen}`);
  };
  probe("readinessProbe", [READY], true);
  probe("livenessProbe", [LIVE], true);
  probe("startupProbe", [LIVE, READY], ctx.requireStartup);

  const req = c.resources?.requests || {};
  const lim = c.resources?.limits || {};
  for (const r of ["memory", "cpu"]) {
    if (req[r] === undefined || lim[r] === undefined)
      p.push(`container ${c.name}: resources.requests.${r} and limits.${r} must both be set (Guaranteed QoS)`);
    else if (!(quantity(req[r]) === quantity(lim[r])))
      p.push(`container ${c.name}: ${r} request ${req[r]} != limit ${lim[r]} (Guaranteed QoS; --memory auto reads the limit)`);
  }

  const pre = c.lifecycle?.preStop;
  let sleepS = 0;
  if (pre?.exec?.command) {
    const cmd = pre.exec.command;
    const i = cmd.indexOf("sleep");
    sleepS = i >= 0 ? Number(cmd[i + 1]) : NaN;
    if (!(sleepS > 0)) p.push(`container ${c.name}: preStop must be "sleep N" (got ${JSON.stringify(cmd)})`);
  } else if (pre?.sleep?.seconds !== undefined) {
    sleepS = Number(pre.sleep.seconds);
  } else {
    p.push(`container ${c.name}: no preStop wait (the endpoints need time to drop the pod before SIGTERM)`);
  }
  const graceMs = Number(argAfter(args, "--grace-ms") ?? GRACE_MS_DEFAULT);
  const need = sleepS + graceMs / 1000 + EXIT_MARGIN_S;
  if (!(ctx.graceS >= need))
    p.push(`container ${c.name}: terminationGracePeriodSeconds ${ctx.graceS} < preStop ${sleepS} s + ` +
      `--grace-ms ${graceMs / 1000} s + ${EXIT_MARGIN_S} s margin = ${need} s`);

  const sc = c.securityContext || {};
  const pod = ctx.podSecurity || {};
  const nonRoot = sc.runAsNonRoot ?? pod.runAsNonRoot;
  const uid = sc.runAsUser ?? pod.runAsUser;
  if (nonRoot !== true) p.push(`container ${c.name}: runAsNonRoot must be true`);
  if (uid === 0) p.push(`container ${c.name}: runAsUser 0 (root)`);
  if (sc.readOnlyRootFilesystem !== true) p.push(`container ${c.name}: readOnlyRootFilesystem must be true`);
  if (sc.allowPrivilegeEscalation !== false) p.push(`container ${c.name}: allowPrivilegeEscalation must be false`);
  if (!(sc.capabilities?.drop || []).includes("ALL")) p.push(`container ${c.name}: capabilities must drop ALL`);

  const img = String(c.image || "");
  if (!/:[A-Za-z0-9_][A-Za-z0-9_.-]*$/.test(img.replace(/@sha256:.*$/, ":digest")) || /:latest$/.test(img))
    p.push(`container ${c.name}: image "${img}" needs an explicit tag other than latest`);
  return p;
}

// Schema check of a Kubernetes container (kubernetes-models), as problems.
function containerSchema(c, label) {
  try {
    new K.Container(c).validate();
    return [];
  } catch (e) {
    return [`${label}: ${e.message}`];
  }
}

function checkDeployment(d) {
  const p = [];
  const spec = d.spec?.template?.spec || {};
  const cs = spec.containers || [];
  const server = cs.find((c) => [...(c.command || []), ...(c.args || [])].includes("serve"));
  if (!server) return ["no container runs the server (args with \"serve\")"];
  p.push(...checkServerContainer(server, {
    podSecurity: spec.securityContext,
    graceS: spec.terminationGracePeriodSeconds ?? K8S_GRACE_DEFAULT,
    requireStartup: true,
  }));
  // The models: a read-only mount of a read-only claim.
  const dir = argAfter(server.args, "--model-repository") ?? "/models";
  const mount = (server.volumeMounts || []).find((m) => m.mountPath === dir);
  if (!mount) p.push(`container ${server.name}: nothing mounted at the model folder ${dir}`);
  else {
    if (mount.readOnly !== true) p.push(`container ${server.name}: the model mount ${dir} must be readOnly`);
    const vol = (spec.volumes || []).find((v) => v.name === mount.name);
    if (!vol?.persistentVolumeClaim) p.push(`volume ${mount.name}: the models should be a PersistentVolumeClaim shared by the pods`);
    else if (vol.persistentVolumeClaim.readOnly !== true) p.push(`volume ${mount.name}: the claim must be mounted readOnly`);
  }
  const rolling = d.spec?.strategy?.rollingUpdate;
  if (rolling && String(rolling.maxUnavailable) !== "0")
    p.push(`strategy: maxUnavailable ${rolling.maxUnavailable} (0 keeps the capacity during a rollout)`);
  return p;
}

// KServe: the runtime's container, with the grace period of the
// InferenceServices that use it (the runtime has no pod-level period).
function checkServingRuntime(rt, services) {
  const p = [];
  const spec = rt.spec || {};
  const c = (spec.containers || []).find((x) => x.name === "kserve-container");
  if (!c) return ["no container named kserve-container (KServe looks the model server up by that name)"];
  const users = services.filter((s) => s.spec?.predictor?.model?.runtime === rt.metadata?.name);
  const graces = users.map((s) => s.spec.predictor.terminationGracePeriodSeconds ?? K8S_GRACE_DEFAULT);
  p.push(...checkServerContainer(c, {
    graceS: graces.length ? Math.min(...graces) : K8S_GRACE_DEFAULT,
    requireStartup: false,
  }));
  if (!(c.ports || []).some((x) => x.name === "http1"))
    p.push(`container ${c.name}: the HTTP port must be named http1 (KServe's convention)`);
  if (argAfter(c.args, "--model-repository") !== "/mnt/models")
    p.push(`container ${c.name}: args must contain "--model-repository /mnt/models" (where KServe puts storageUri)`);
  if (!(spec.protocolVersions || []).includes("v2")) p.push("protocolVersions must include v2");
  if (!(spec.supportedModelFormats || []).some((f) => f.name === "onnx")) p.push("supportedModelFormats must include onnx");
  return p;
}

function checkInferenceService(s, runtimes) {
  const p = [];
  const m = s.spec?.predictor?.model || {};
  const rt = runtimes.find((r) => r.metadata?.name === m.runtime);
  if (!rt) p.push(`predictor.model.runtime "${m.runtime}" names no ServingRuntime under deploy/`);
  else if (!(rt.spec.supportedModelFormats || []).some((f) => f.name === m.modelFormat?.name))
    p.push(`modelFormat ${m.modelFormat?.name} is not among runtime ${m.runtime}'s supportedModelFormats`);
  if (m.protocolVersion && m.protocolVersion !== "v2") p.push(`protocolVersion ${m.protocolVersion} (the server speaks v2)`);
  if (m.storageUri && !/^pvc:\/\/[a-z0-9][-a-z0-9.]*(\/.*)?$/.test(m.storageUri))
    p.push(`storageUri ${m.storageUri}: the example should be a pvc:// claim (read-only, shared)`);
  // Container fields given on the model override the runtime's: they too must pass.
  const { modelFormat, runtime, storageUri, runtimeVersion, protocolVersion, storage, ...container } = m;
  if (Object.keys(container).length) p.push(...containerSchema({ name: "kserve-container", ...container }, "predictor.model"));
  return p;
}

// ---- the Containerfile --------------------------------------------------------------------

function checkContainerfile(text, depsText, manifestPorts) {
  const p = [];
  // Joined continuation lines, comments dropped.
  const lines = text.replace(/\\\n/g, " ").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
  const args = {};
  const stages = [];
  for (const l of lines) {
    const [ins, ...rest] = l.split(/\s+/);
    const r = rest.join(" ");
    const I = ins.toUpperCase();
    if (I === "ARG" && !stages.length) {
      const [k, v] = r.split("=");
      args[k] = v;
    } else if (I === "FROM") {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?/i.exec(r);
      stages.push({ from: m[1], name: m[2], lines: [] });
    } else if (stages.length) stages[stages.length - 1].lines.push([I, r]);
  }
  if (!stages.length) return ["no FROM"];
  const names = new Set(stages.map((s) => s.name).filter(Boolean));
  const expand = (img) => img.replace(/\$\{?([A-Za-z_]+)\}?/g, (_, k) => args[k] ?? `\${${k}}`);
  for (const s of stages) {
    if (names.has(s.from)) continue;
    const img = expand(s.from);
    if (img !== "debian:bookworm-slim") p.push(`FROM ${s.from} (= ${img}): the base must be debian:bookworm-slim`);
    if (/:latest$/.test(img) || !/:/.test(img)) p.push(`FROM ${img}: a tag other than latest is needed`);
  }
  // The effective USER of a stage: its last USER, else its parent stage's.
  const userOf = (s) => {
    const u = s.lines.filter(([i]) => i === "USER").pop();
    if (u) return u[1];
    const parent = stages.find((x) => x.name === s.from);
    return parent ? userOf(parent) : "0";
  };
  const imageStages = [stages[stages.length - 1], ...stages.filter((s) => s.name === "fetch")];
  for (const s of imageStages) {
    const u = userOf(s);
    if (!/^[0-9]+(:[0-9]+)?$/.test(u)) p.push(`stage ${s.name}: USER ${u} must be numeric (runAsNonRoot checks a number)`);
    else if (Number(u.split(":")[0]) === 0) p.push(`stage ${s.name}: runs as root (USER ${u})`);
  }
  const all = stages.flatMap((s) => s.lines);
  const one = (I) => all.filter(([i]) => i === I).map(([, r]) => r);
  if (!one("STOPSIGNAL").includes("SIGTERM")) p.push("STOPSIGNAL SIGTERM missing (the server drains on SIGTERM)");
  const exposed = one("EXPOSE").flatMap((r) => r.split(/\s+/)).map((x) => Number(x.split("/")[0]));
  for (const port of manifestPorts)
    if (!exposed.includes(port)) p.push(`EXPOSE lacks ${port}, the manifests' containerPort`);
  const cmd = one("CMD").pop() || "";
  let cmdArgs = [];
  try {
    cmdArgs = JSON.parse(cmd);
  } catch {
    p.push("CMD must be in exec form (a JSON array)");
  }
  if (argAfter(cmdArgs, "--memory") !== "auto") p.push("CMD lacks --memory auto");
  if (argAfter(cmdArgs, "--host") !== "0.0.0.0") p.push("CMD lacks --host 0.0.0.0");
  const ep = one("ENTRYPOINT").pop() || "";
  if (!ep.startsWith("[")) p.push("ENTRYPOINT must be in exec form (signals reach the server)");
  // The build stage's packages against deps.sh's libraries.
  const build = stages.find((s) => s.name === "build");
  const installed = new Set((build?.lines || []).filter(([i]) => i === "RUN").flatMap(([, r]) => r.split(/\s+/)));
  const depsPkgs = (/pkgs=\(([\s\S]*?)\n\)/.exec(depsText)?.[1] || "")
    .split("\n").map((l) => l.replace(/#.*/, "")).join(" ").split(/\s+/).filter(Boolean);
  if (!depsPkgs.length) p.push("could not read the package list of scripts/setup/deps.sh");
  for (const pkg of depsPkgs)
    if (/-dev$/.test(pkg) && !TEST_ONLY_DEV.has(pkg) && !installed.has(pkg))
      p.push(`build stage lacks ${pkg}, which scripts/setup/deps.sh installs (a new build dependency?)`);
  return p;
}

// ---- the whole set --------------------------------------------------------------------------

// files: [{ rel, docs, errors }]; containerfile, deps: texts. Returns a Map rel -> problems.
function validateAll(files, containerfile, deps) {
  const out = new Map();
  const docs = files.flatMap((f) => f.docs.map((d) => ({ f, d })));
  const runtimes = docs.map((x) => x.d).filter((d) => /ServingRuntime$/.test(d?.kind));
  const services = docs.map((x) => x.d).filter((d) => d?.kind === "InferenceService");
  const ports = new Set();
  for (const f of files) {
    const p = [...f.errors];
    for (const d of f.docs) {
      const key = `${d?.apiVersion} ${d?.kind}`;
      const at = where(d);
      if (CORE[key]) {
        try {
          new CORE[key](d).validate();
        } catch (e) {
          p.push(`${at}: schema: ${e.message}`);
        }
      } else if (KSERVE[key]) {
        const v = KSERVE[key];
        if (!v(d)) for (const e of v.errors) p.push(`${at}: schema: ${e.instancePath || "/"} ${e.message}` +
          (e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : "") +
          (e.params?.allowedValues ? ` (${e.params.allowedValues.join(", ")})` : ""));
        const cs = [...(d.spec?.containers || []), ...(d.spec?.predictor?.containers || [])];
        cs.forEach((c, i) => p.push(...containerSchema(c, `${at}: containers[${i}]`)));
      } else {
        p.push(`${at}: ${key} is not a kind this check knows: add it to scripts/deploy/validate.mjs`);
        continue;
      }
      let extra = [];
      if (d.kind === "Deployment") extra = checkDeployment(d);
      else if (/ServingRuntime$/.test(d.kind)) extra = checkServingRuntime(d, services);
      else if (d.kind === "InferenceService") extra = checkInferenceService(d, runtimes);
      p.push(...extra.map((x) => `${at}: ${x}`));
      const cs = d.kind === "Deployment" ? d.spec?.template?.spec?.containers : d.spec?.containers;
      for (const c of cs || []) for (const port of c.ports || []) ports.add(port.containerPort);
    }
    out.set(f.rel, p);
  }
  out.set("deploy/Containerfile", checkContainerfile(containerfile, deps, [...ports]));
  return out;
}

function report(results) {
  let bad = 0;
  for (const [rel, problems] of results) {
    if (!problems.length) console.log(`ok      ${rel}`);
    else {
      bad++;
      console.log(`FAILED  ${rel}`);
      for (const x of problems) console.log(`          ${x}`);
    }
  }
  return bad;
}

// ---- main ------------------------------------------------------------------------------------

const deployDir = path.join(root, "deploy");
const files = findManifests(deployDir).map((f) =>
  parseFile(path.relative(root, f), fs.readFileSync(f, "utf8")));
const containerfile = fs.readFileSync(path.join(deployDir, "Containerfile"), "utf8");
const deps = fs.readFileSync(path.join(root, "scripts", "setup", "deps.sh"), "utf8");
const t0 = Date.now();
const bad = report(validateAll(files, containerfile, deps));
console.log(`validate: ${files.length + 1} files, ${bad} with problems (${Date.now() - t0} ms)`);

let selfBad = 0;
if (selfTest) {
  // Each mutation breaks one thing in a copy of the files; the checks must
  // then report a problem matching `expect` in the file named.
  const byKind = (fs_, kind) => {
    for (const f of fs_) for (const d of f.docs) if (d.kind === kind) return d;
    throw new Error(`self-test: no ${kind} under deploy/`);
  };
  const server = (fs_) => byKind(fs_, "Deployment").spec.template.spec.containers[0];
  const rtc = (fs_) => byKind(fs_, "ServingRuntime").spec.containers[0];
  const setArg = (c, flag, v) => { c.args[c.args.indexOf(flag) + 1] = v; };
  const mutations = [
    ["memory limit above the request", /memory request .* != limit/, (x) => { server(x).resources.limits.memory = "2Gi"; }],
    ["readiness on another path", /readinessProbe path/, (x) => { server(x).readinessProbe.httpGet.path = "/healthz"; }],
    ["liveness on the ready path", /livenessProbe path/, (x) => { server(x).livenessProbe.httpGet.path = READY; }],
    ["no --memory auto", /--memory auto/, (x) => { setArg(server(x), "--memory", "512M"); }],
    ["grace period too short", /terminationGracePeriodSeconds 15 </, (x) => { byKind(x, "Deployment").spec.template.spec.terminationGracePeriodSeconds = 15; }],
    ["--grace-ms raised past the period", /terminationGracePeriodSeconds 30 </, (x) => { setArg(server(x), "--grace-ms", "60000"); }],
    ["runs as root", /runAsUser 0/, (x) => { server(x).securityContext.runAsUser = 0; }],
    ["writable root filesystem", /readOnlyRootFilesystem/, (x) => { server(x).securityContext.readOnlyRootFilesystem = false; }],
    ["models mounted writable", /model mount .* readOnly/, (x) => { server(x).volumeMounts.find((m) => m.name === "models").readOnly = false; }],
    ["containerPort as a string (schema)", /containerPort must be integer/, (x) => { server(x).ports[0].containerPort = "8080"; }],
    ["unknown Service type (schema)", /schema/, (x) => { byKind(x, "Service").spec.type = "Balancer"; }],
    ["image tag latest", /explicit tag/, (x) => { server(x).image = "edgeserve:latest"; }],
    ["runtime: unknown spec field (schema)", /additional properties \(supportedModelFormat\)/, (x) => {
      const s = byKind(x, "ServingRuntime").spec; s.supportedModelFormat = s.supportedModelFormats; }],
    ["runtime: protocol v3 (schema)", /allowed values/, (x) => { byKind(x, "ServingRuntime").spec.protocolVersions = ["v3"]; }],
    ["runtime: port not http1", /http1/, (x) => { rtc(x).ports[0].name = "http"; }],
    ["runtime: container renamed", /kserve-container/, (x) => { rtc(x).name = "server"; }],
    ["runtime: memory request != limit", /memory request .* != limit/, (x) => { rtc(x).resources.requests.memory = "512Mi"; }],
    ["isvc: unknown runtime", /names no ServingRuntime/, (x) => { byKind(x, "InferenceService").spec.predictor.model.runtime = "triton"; }],
    ["isvc: grace period too short for the runtime", /terminationGracePeriodSeconds 10 </, (x) => {
      byKind(x, "InferenceService").spec.predictor.terminationGracePeriodSeconds = 10; }],
    ["isvc: modelFormat missing (schema)", /modelFormat/, (x) => { delete byKind(x, "InferenceService").spec.predictor.model.modelFormat; }],
  ];
  const cfMutations = [
    ["Containerfile: USER root", /runs as root|must be numeric/, (t) => t.replace(/^USER 10001:10001$/m, "USER root")],
    ["Containerfile: base latest", /bookworm-slim|latest/, (t) => t.replace(/^ARG DEBIAN_IMAGE=.*$/m, "ARG DEBIAN_IMAGE=debian:latest")],
    ["Containerfile: no STOPSIGNAL", /STOPSIGNAL/, (t) => t.replace(/^STOPSIGNAL .*$/m, "")],
    ["Containerfile: build lacks a deps.sh library", /lacks libspng-dev/, (t) => t.replace(/ libspng-dev/, "")],
  ];
  console.log(`\nself-test: ${mutations.length + cfMutations.length + 2} cases`);
  const caseResult = (label, ok, detail) => {
    console.log(`${ok ? "ok      " : "FAILED  "}self-test: ${label}${ok ? "" : `: ${detail}`}`);
    if (!ok) selfBad++;
  };
  const flat = (r) => [...r.values()].flat();
  // The intact copy must pass, or every "rejected" below means nothing.
  caseResult("intact files accepted", flat(validateAll(files.map(clone), containerfile, deps)).length === 0,
    "the unmodified files have problems (see above)");
  // A YAML syntax error must be caught as such.
  const broken = parseFile("deploy/k8s/broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n");
  caseResult("YAML syntax error rejected", broken.errors.some((e) => /YAML/.test(e)), "parsed without an error");
  for (const [label, expect, mutate] of mutations) {
    const copy = files.map((f) => ({ ...f, docs: f.docs.map(clone), errors: [...f.errors] }));
    mutate(copy);
    const probs = flat(validateAll(copy, containerfile, deps));
    caseResult(`${label} rejected`, probs.some((x) => expect.test(x)),
      probs.length ? `problems found, none matching ${expect}: ${probs.join(" | ")}` : "no problem found");
  }
  for (const [label, expect, mutate] of cfMutations) {
    const t = mutate(containerfile);
    const probs = checkContainerfile(t, deps, [8080]);
    caseResult(`${label} rejected`, t !== containerfile && probs.some((x) => expect.test(x)),
      t === containerfile ? "the mutation matched nothing" : `problems: ${probs.join(" | ") || "none"}`);
  }
  console.log(`self-test: ${selfBad} failed`);
}
process.exit(bad || selfBad ? 1 : 0);
