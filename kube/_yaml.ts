/**
 * The parts of npm:yaml the kubeconfig reader uses, imported statically so the bundler
 * resolves them. `kube/kubeconfig.ts` loads this module with `import()` (YAML is read only
 * when a kubeconfig is YAML): an `import()` of the npm package itself is a CommonJS module in
 * the bundle, whose chunk has a default export only, so its named exports were undefined
 * there (`TypeError: s is not a constructor` at the agent's start, issue 41) although the same
 * import worked from source. `scripts/bundle_lazy_test.ts` refuses an `import()` of a package.
 *
 * @module
 */
export { LineCounter, parseDocument } from "yaml";
