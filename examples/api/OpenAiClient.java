// A Java client for `candle-web serve --api`, with the JDK's java.net.http only (no library):
// a chat completion, the same chat streamed (server-sent events), and an audio transcription
// (a multipart upload).
//
//   candle-web serve --api --model smollm2-135m-instruct --model whisper-tiny.en
//   java examples/api/OpenAiClient.java http://127.0.0.1:8000/v1 smollm2-135m-instruct \
//        "What is the capital of France?" whisper-tiny.en clip.wav
//
// Set CANDLE_WEB_API_KEY when the server was started with --api-key. Prints three lines:
// "chat: ...", "stream: ...", "transcript: ..." (JSON-escaped answers decoded).

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.UUID;

public class OpenAiClient {
    private static final HttpClient HTTP = HttpClient.newBuilder()
            .connectTimeout(Duration.ofSeconds(10)).build();

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: OpenAiClient BASE_URL CHAT_MODEL PROMPT AUDIO_MODEL AUDIO_FILE");
            System.exit(2);
        }
        String base = args[0], chatModel = args[1], prompt = args[2];
        String audioModel = args[3];
        Path audio = Path.of(args[4]);

        String chatBody = "{\"model\": " + quote(chatModel) + ", \"temperature\": 0, \"max_tokens\": 24,"
                + " \"messages\": [{\"role\": \"user\", \"content\": " + quote(prompt) + "}]";
        HttpResponse<String> chat = HTTP.send(json(base + "/chat/completions", chatBody + "}"),
                HttpResponse.BodyHandlers.ofString());
        check(chat.statusCode(), chat.body());
        System.out.println("chat: " + stringField(chat.body(), "content"));

        // Streaming: one `data: {...}` line per piece, then `data: [DONE]`.
        HttpResponse<java.io.InputStream> stream = HTTP.send(
                json(base + "/chat/completions", chatBody + ", \"stream\": true}"),
                HttpResponse.BodyHandlers.ofInputStream());
        check(stream.statusCode(), "");
        StringBuilder streamed = new StringBuilder();
        try (BufferedReader lines = new BufferedReader(
                new InputStreamReader(stream.body(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = lines.readLine()) != null) {
                if (!line.startsWith("data: ")) continue;
                String data = line.substring(6);
                if (data.equals("[DONE]")) break;
                String piece = stringField(data, "content");
                if (piece != null) streamed.append(piece);
            }
        }
        System.out.println("stream: " + streamed);

        // The transcription: multipart/form-data with the file and the model name.
        String boundary = "candle-web-" + UUID.randomUUID();
        ByteArrayOutputStream form = new ByteArrayOutputStream();
        form.write(("--" + boundary + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
                + audioModel + "\r\n").getBytes(StandardCharsets.UTF_8));
        form.write(("--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\""
                + audio.getFileName() + "\"\r\nContent-Type: application/octet-stream\r\n\r\n")
                .getBytes(StandardCharsets.UTF_8));
        form.write(Files.readAllBytes(audio));
        form.write(("\r\n--" + boundary + "--\r\n").getBytes(StandardCharsets.UTF_8));
        HttpRequest upload = authorised(HttpRequest.newBuilder(URI.create(base + "/audio/transcriptions")))
                .header("Content-Type", "multipart/form-data; boundary=" + boundary)
                .timeout(Duration.ofMinutes(5))
                .POST(HttpRequest.BodyPublishers.ofByteArray(form.toByteArray())).build();
        HttpResponse<String> transcript = HTTP.send(upload, HttpResponse.BodyHandlers.ofString());
        check(transcript.statusCode(), transcript.body());
        System.out.println("transcript: " + stringField(transcript.body(), "text"));
    }

    private static HttpRequest json(String url, String body) {
        return authorised(HttpRequest.newBuilder(URI.create(url)))
                .header("Content-Type", "application/json")
                .timeout(Duration.ofMinutes(5))
                .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8)).build();
    }

    private static HttpRequest.Builder authorised(HttpRequest.Builder builder) {
        String key = System.getenv("CANDLE_WEB_API_KEY");
        return key == null || key.isEmpty() ? builder : builder.header("Authorization", "Bearer " + key);
    }

    private static void check(int status, String body) {
        if (status != 200) {
            System.err.println("HTTP " + status + ": " + body);
            System.exit(1);
        }
    }

    /** A JSON string literal. */
    private static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
            }
        }
        return out.append('"').toString();
    }

    /** The first string value of "name" in a JSON text (enough for these answers), decoded. */
    private static String stringField(String json, String name) {
        String key = "\"" + name + "\":";
        int at = json.indexOf(key);
        if (at < 0) return null;
        int i = at + key.length();
        while (i < json.length() && json.charAt(i) == ' ') i++;
        if (i >= json.length() || json.charAt(i) != '"') return null;  // null or not a string
        StringBuilder out = new StringBuilder();
        for (i = i + 1; i < json.length(); i++) {
            char c = json.charAt(i);
            if (c == '"') return out.toString();
            if (c != '\\') { out.append(c); continue; }
            char e = json.charAt(++i);
            switch (e) {
                case 'n': out.append('\n'); break;
                case 't': out.append('\t'); break;
                case 'r': out.append('\r'); break;
                case 'b': out.append('\b'); break;
                case 'f': out.append('\f'); break;
                case 'u': out.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16)); i += 4; break;
                default: out.append(e);  // \" \\ \/
            }
        }
        return null;
    }
}
