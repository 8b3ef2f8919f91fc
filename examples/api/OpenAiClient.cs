// A C# client for `candle-web serve --api`, with HttpClient only (no package): a chat
// completion, the same chat streamed (server-sent events), and an audio transcription (a
// multipart upload).
//
//   candle-web serve --api --model smollm2-135m-instruct --model whisper-tiny.en
//   mcs -r:System.Net.Http.dll -out:client.exe examples/api/OpenAiClient.cs     # Mono
//   mono client.exe http://127.0.0.1:8000/v1 smollm2-135m-instruct \
//        "What is the capital of France?" whisper-tiny.en clip.wav
//
// Set CANDLE_WEB_API_KEY when the server was started with --api-key. Prints three lines:
// "chat: ...", "stream: ...", "transcript: ..." (JSON-escaped answers decoded).

using System;
using System.Globalization;
using System.IO;
using System.Net.Http;
using System.Net.Http.Headers;
using System.Text;
using System.Threading.Tasks;

public static class OpenAiClient
{
    static readonly HttpClient Http = new HttpClient { Timeout = TimeSpan.FromMinutes(5) };

    public static int Main(string[] args)
    {
        if (args.Length != 5)
        {
            Console.Error.WriteLine("usage: OpenAiClient BASE_URL CHAT_MODEL PROMPT AUDIO_MODEL AUDIO_FILE");
            return 2;
        }
        return Run(args[0], args[1], args[2], args[3], args[4]).GetAwaiter().GetResult();
    }

    static async Task<int> Run(string baseUrl, string chatModel, string prompt, string audioModel,
                               string audioPath)
    {
        string key = Environment.GetEnvironmentVariable("CANDLE_WEB_API_KEY");
        if (!string.IsNullOrEmpty(key))
            Http.DefaultRequestHeaders.Authorization = new AuthenticationHeaderValue("Bearer", key);

        string chatBody = "{\"model\": " + Quote(chatModel) + ", \"temperature\": 0, \"max_tokens\": 24,"
            + " \"messages\": [{\"role\": \"user\", \"content\": " + Quote(prompt) + "}]";
        var chat = await Http.PostAsync(baseUrl + "/chat/completions",
            new StringContent(chatBody + "}", Encoding.UTF8, "application/json"));
        string chatText = await chat.Content.ReadAsStringAsync();
        if (!chat.IsSuccessStatusCode) return Fail(chat, chatText);
        Console.WriteLine("chat: " + StringField(chatText, "content"));

        // Streaming: one `data: {...}` line per piece, then `data: [DONE]`.
        var request = new HttpRequestMessage(HttpMethod.Post, baseUrl + "/chat/completions")
        {
            Content = new StringContent(chatBody + ", \"stream\": true}", Encoding.UTF8, "application/json")
        };
        var stream = await Http.SendAsync(request, HttpCompletionOption.ResponseHeadersRead);
        if (!stream.IsSuccessStatusCode) return Fail(stream, await stream.Content.ReadAsStringAsync());
        var streamed = new StringBuilder();
        using (var reader = new StreamReader(await stream.Content.ReadAsStreamAsync(), Encoding.UTF8))
        {
            string line;
            while ((line = await reader.ReadLineAsync()) != null)
            {
                if (!line.StartsWith("data: ")) continue;
                string data = line.Substring(6);
                if (data == "[DONE]") break;
                string piece = StringField(data, "content");
                if (piece != null) streamed.Append(piece);
            }
        }
        Console.WriteLine("stream: " + streamed);

        // The transcription: multipart/form-data with the file and the model name.
        var form = new MultipartFormDataContent();
        form.Add(new StringContent(audioModel), "model");
        var file = new ByteArrayContent(File.ReadAllBytes(audioPath));
        file.Headers.ContentType = new MediaTypeHeaderValue("application/octet-stream");
        form.Add(file, "file", Path.GetFileName(audioPath));
        var transcript = await Http.PostAsync(baseUrl + "/audio/transcriptions", form);
        string transcriptText = await transcript.Content.ReadAsStringAsync();
        if (!transcript.IsSuccessStatusCode) return Fail(transcript, transcriptText);
        Console.WriteLine("transcript: " + StringField(transcriptText, "text"));
        return 0;
    }

    static int Fail(HttpResponseMessage response, string body)
    {
        Console.Error.WriteLine("HTTP " + (int)response.StatusCode + ": " + body);
        return 1;
    }

    // A JSON string literal.
    static string Quote(string text)
    {
        var output = new StringBuilder("\"");
        foreach (char c in text)
        {
            switch (c)
            {
                case '"': output.Append("\\\""); break;
                case '\\': output.Append("\\\\"); break;
                case '\n': output.Append("\\n"); break;
                case '\r': output.Append("\\r"); break;
                case '\t': output.Append("\\t"); break;
                default:
                    if (c < 0x20) output.Append("\\u" + ((int)c).ToString("x4"));
                    else output.Append(c);
                    break;
            }
        }
        return output.Append('"').ToString();
    }

    // The first string value of "name" in a JSON text (enough for these answers), decoded.
    static string StringField(string json, string name)
    {
        string key = "\"" + name + "\":";
        int at = json.IndexOf(key, StringComparison.Ordinal);
        if (at < 0) return null;
        int i = at + key.Length;
        while (i < json.Length && json[i] == ' ') i++;
        if (i >= json.Length || json[i] != '"') return null;  // null or not a string
        var output = new StringBuilder();
        for (i = i + 1; i < json.Length; i++)
        {
            char c = json[i];
            if (c == '"') return output.ToString();
            if (c != '\\') { output.Append(c); continue; }
            char e = json[++i];
            switch (e)
            {
                case 'n': output.Append('\n'); break;
                case 't': output.Append('\t'); break;
                case 'r': output.Append('\r'); break;
                case 'b': output.Append('\b'); break;
                case 'f': output.Append('\f'); break;
                case 'u':
                    output.Append((char)int.Parse(json.Substring(i + 1, 4), NumberStyles.HexNumber));
                    i += 4;
                    break;
                default: output.Append(e); break;  // \" \\ \/
            }
        }
        return null;
    }
}
