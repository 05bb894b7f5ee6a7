// One streamed chat completion through the official openai-node SDK, read with the loop of its
// README (`chunk.choices[0]?.delta?.content`). Prints {"text", "chunks", "progress"} as JSON.
//   node stream_chat.mjs <openai4|openai6> <baseURL> <apiKey> <prompt> [include_tool_progress]
const [pkg, baseURL, apiKey, prompt, progress] = process.argv.slice(2);
const { default: OpenAI } = await import(pkg);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const body = { model: "hermes-agent", stream: true, messages: [{ role: "user", content: prompt }] };
if (progress !== undefined) body.stream_options = { include_tool_progress: progress === "true" };
const stream = await client.chat.completions.create(body);
let text = "";
let chunks = 0;
let withProgress = 0;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.object === "hermes.tool.progress") withProgress += 1;
  text += chunk.choices[0]?.delta?.content || "";
}
console.log(JSON.stringify({ text, chunks, progress: withProgress }));
